// The bottom-up fixed-point walk of graph_rewrite.h, on an explicit stack.
//
// A frame goes through three steps: push the sources that are not rewritten yet; once they
// are, rebuild the node on the rewritten sources and apply rules to it until none matches;
// if a rule produced a node whose sources still need rewriting, wait for that node's own
// frame and take its result. `done` maps every node seen (original, rebuilt, intermediate)
// to its final form, and each final form to itself, so nothing is rewritten twice.
#include "compiler/rewrite/graph_rewrite.h"

#include <cassert>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "compiler/support/strings.h"

namespace uop::rw {
namespace {

class Rewriter {
 public:
  Rewriter(Graph& g, const RuleSet& rules, void* ctx, const RewriteOptions& opt)
      : g_(g), rules_(rules), ctx_(ctx), opt_(opt) {}

  absl::StatusOr<const UOp*> run(const UOp* root) {
    assert(root);
    push(root);
    while (!stack_.empty()) {
      Frame& f = stack_.back();
      if (done_.contains(f.node)) {
        stack_.pop_back();
        continue;
      }
      switch (f.step) {
        case Step::kSources: {
          f.step = Step::kRules;
          const UOp* u = f.node;  // push() may move the frame
          for (size_t i = u->num_src(); i-- > 0;)
            if (!done_.contains(u->src(i))) push(u->src(i));
          break;
        }
        case Step::kRules: {
          absl::Status st = rules_step(stack_.size() - 1);
          if (!st.ok()) return st;
          break;
        }
        case Step::kAwait: {
          const UOp* result = done_.at(f.waiting);
          finish(f.node, f.rebuilt, result);
          stack_.pop_back();
          break;
        }
      }
    }
    return done_.at(root);
  }

 private:
  enum class Step : uint8_t { kSources, kRules, kAwait };
  struct Frame {
    const UOp* node;
    Step step;
    const UOp* rebuilt;  // kAwait: the node on rewritten sources
    const UOp* waiting;  // kAwait: the node whose result becomes ours
  };

  void push(const UOp* u) { stack_.push_back({u, Step::kSources, nullptr, nullptr}); }

  // `node` and the node rebuilt from it on rewritten sources both end as `result`, which
  // is final: rewriting it again would change nothing.
  void finish(const UOp* node, const UOp* rebuilt, const UOp* result) {
    done_.insert_or_assign(node, result);
    if (rebuilt != node) done_.insert_or_assign(rebuilt, result);
    if (result != node && result != rebuilt) done_.insert_or_assign(result, result);
  }

  // Whether every source of `u` is already in its final form.
  bool sources_final(const UOp* u) const {
    for (const UOp* s : u->src()) {
      auto it = done_.find(s);
      if (it == done_.end() || it->second != s) return false;
    }
    return true;
  }

  absl::Status rules_step(size_t fi) {
    const UOp* node = stack_[fi].node;
    src_buf_.clear();
    for (const UOp* s : node->src()) src_buf_.push_back(done_.at(s));
    const UOp* rebuilt = g_.replace_src(node, src_buf_);
    if (auto it = done_.find(rebuilt); it != done_.end()) {
      finish(node, node, it->second);
      stack_.pop_back();
      return absl::OkStatus();
    }
    const UOp* cur = rebuilt;
    while (true) {
      RuleSet::Applied a = rules_.apply(g_, cur, ctx_);
      if (!a.node) break;
      if (++rewrites_ > opt_.max_rewrites) return no_fixed_point(*a.rule, cur);
      if (g_.node_limit() != 0 && g_.size() > g_.node_limit()) return over_node_limit(*a.rule);
      if (opt_.trace) opt_.trace(*a.rule, cur, a.node);
      if (auto it = done_.find(a.node); it != done_.end()) {
        cur = it->second;  // rewritten before: its result is final
        break;
      }
      if (!sources_final(a.node)) {
        // The replacement has unrewritten sources: rewrite it bottom-up in its own frame
        // and take its result when that is done.
        stack_[fi].step = Step::kAwait;
        stack_[fi].rebuilt = rebuilt;
        stack_[fi].waiting = a.node;
        push(a.node);
        return absl::OkStatus();
      }
      cur = a.node;  // keep applying rules here
    }
    finish(node, rebuilt, cur);
    stack_.pop_back();
    return absl::OkStatus();
  }

  absl::Status no_fixed_point(const Rule& rule, const UOp* at) const {
    const std::string& name = opt_.name.empty() ? rules_.name() : opt_.name;
    return absl::InvalidArgumentError(
        cat("rewrite '", name, "' did not converge after ", opt_.max_rewrites, " rewrites (last rule '",
            rule.name(), "' at ", op_name(at->op()), " : ", at->dtype().str(), ") [rewrite.no_fixed_point]"));
  }

  absl::Status over_node_limit(const Rule& rule) const {
    const std::string& name = opt_.name.empty() ? rules_.name() : opt_.name;
    return absl::ResourceExhaustedError(cat("rewrite '", name, "' (rule '", rule.name(), "') grew the graph past ",
                                            g_.node_limit(), " nodes, the limit ", g_.node_limit_name(),
                                            " [rewrite.node_limit]"));
  }

  Graph& g_;
  const RuleSet& rules_;
  void* ctx_;
  const RewriteOptions& opt_;
  std::vector<Frame> stack_;
  absl::flat_hash_map<const UOp*, const UOp*> done_;
  std::vector<const UOp*> src_buf_;
  size_t rewrites_ = 0;
};

}  // namespace

absl::StatusOr<const UOp*> graph_rewrite(Graph& g, const UOp* root, const RuleSet& rules, void* ctx,
                                         const RewriteOptions& options) {
  return Rewriter(g, rules, ctx, options).run(root);
}

}  // namespace uop::rw
