// The GPU emulator (gpu_emu.h). prepare() turns the verified LINEAR into a list of
// instructions, one per listed op, with every value's place in a thread's value array
// (one ConstValue per lane) and every buffer's array decided once; run() then executes
// the grid block by block and each block's threads between their synchronization points.
//
// What a thread holds: its program counter, its values, the ends of its open loops and
// its registers. Definitions (CONST, VCONST, DEFINE_VAR, SPECIAL) are valid anywhere once
// listed, even past a loop that ran zero times, so they are evaluated before the thread
// starts; AFTER and a BARRIER passing a value are their first source's value; an INDEX is
// read by the LOAD or STORE that uses it (its sources are still current there).
#include "compiler/gpu_emu/gpu_emu.h"

#include <algorithm>
#include <array>
#include <optional>
#include <vector>

#include "compiler/codegen/cuda.h"
#include "compiler/codegen/linear_walk.h"
#include "compiler/interp/node_eval.h"
#include "compiler/support/status_macros.h"
#include "compiler/support/strings.h"

namespace uop {
namespace {

using interp_internal::apply_scalar_op;
using interp_internal::const_of;

enum class Kind : uint8_t { Nop, Alu, Gather, Load, Store, Range, End, If, Barrier, Wmma };

// A value's place in a thread's value array: `lanes` ConstValues from `off`.
struct Slot {
  int off = -1;
  int lanes = 0;
  bool valid() const { return off >= 0; }
  int at(int lane) const { return off + (lanes == 1 ? 0 : lane); }  // a scalar broadcasts
};

// One array a LOAD / STORE reaches: a PARAM (the launch's), a DEFINE_LOCAL (the block's)
// or a DEFINE_REG (the thread's). `count` is its element's vector width: INDEX i addresses
// scalar i * count.
struct Mem {
  enum class Space : uint8_t { Global, Shared, Reg } space = Space::Global;
  Scalar scalar = Scalar::Float32;
  int64_t count = 1;
  int64_t scalars = 0;  // scalars it holds
  int64_t slot = 0;     // Global: the PARAM's slot
  int id = 0;           // Shared / Reg: its array among those of its space
  int pos = 0;          // the node defining it
};

struct Instr {
  Kind kind = Kind::Nop;
  const UOp* u = nullptr;
  int pos = 0;
  Slot out;
  std::vector<Slot> src;    // Alu: operands; Range: end; If: condition; Wmma: a, b, c
  std::vector<int> gather;  // Gather: the value-array offset of each lane
  // Load / Store: the array, the INDEX's index and gate, the alt (Load) or value (Store).
  int mem = -1;
  Slot index, gate, data;
  int jump = -1;            // Range: its END; If: its ENDIF
  int range = -1;           // Range: its ordinal
  int close_at = 0;         // Range: its place in its END's `closes`
  std::vector<int> closes;  // End: the RANGEs it closes, innermost first
};

// Per element of a shared array, what happened since the last barrier (epochs count
// barriers): who wrote it, and who read it (the first two readers).
struct SharedTrack {
  int64_t write_epoch = -1;  // -1: never written
  int64_t writer = -1;
  int64_t read_epoch = -1;
  int64_t readers[2] = {-1, -1};
};

// Per element of a written global buffer: the last writer, its block and epoch.
struct GlobalTrack {
  int64_t writer = -1;  // thread id within its block; -1: not written in this launch
  int64_t block = -1;
  int64_t epoch = 0;
};

struct Thread {
  enum class State : uint8_t { Running, AtBarrier, AtWmma, Done };
  int pc = 0;
  State state = State::Running;
  int64_t tid = 0;
  std::array<int64_t, 3> idx{};
  std::vector<ConstValue> v;
  std::vector<int64_t> ends;  // by range ordinal
  std::vector<HostTensor> regs;
  std::vector<std::vector<bool>> reg_written;
};

// The widest value the emulator holds (the renderers' vectors are 16 lanes or fewer).
constexpr uint32_t kMaxLanes = 1 << 12;

constexpr const char* kSpecials[6] = {"blockIdx.x",  "blockIdx.y",  "blockIdx.z",
                                      "threadIdx.x", "threadIdx.y", "threadIdx.z"};

class Emulator {
 public:
  Emulator(const UOp* linear, std::span<HostTensor* const> params,
           const absl::flat_hash_map<std::string, int64_t>& vars, const GpuEmuOptions& o)
      : linear_(linear), params_(params), vars_(vars), opts_(o) {}

  absl::StatusOr<GpuEmuStats> run();

 private:
  absl::Status prepare();
  absl::Status prepare_op(int pos);
  absl::Status bind();
  absl::Status run_block(const std::array<int64_t, 3>& b);
  absl::Status run_thread(Thread& t);
  absl::Status run_wmma(const Instr& in, std::span<Thread> warp);
  absl::Status load(Thread& t, const Instr& in);
  absl::Status store(Thread& t, const Instr& in);
  void advance(Thread& t, const Instr& end, int from);

  // "node 12 (STORE)": the op at that position of the LINEAR.
  std::string node(int pos) const { return cat("node ", pos, " (", op_name(linear_->src(pos)->op()), ")"); }
  absl::Status fail(int pos, std::string_view why) const {
    return absl::InvalidArgumentError(cat(node(pos), ": ", why));
  }
  // "thread (x, y, z) of block (x, y, z)" for a thread of the block running, or of block
  // number `block` (blocks are numbered x fastest, as they run).
  std::string who(const Thread& t) const { return thread_name(t.tid); }
  std::string thread_name(int64_t tid, int64_t block = -1) const {
    const GpuDims& d = stats_.dims;
    if (block < 0) block = block_id_;
    auto xyz = [](int64_t i, const std::array<int64_t, 3>& n) {
      return cat("(", i % n[0], ", ", (i / n[0]) % n[1], ", ", i / (n[0] * n[1]), ")");
    };
    return cat("thread ", xyz(tid, d.block), " of block ", xyz(block, d.grid));
  }
  std::string mem_name(const Mem& m) const {
    switch (m.space) {
      case Mem::Space::Global: return cat("the buffer at slot ", m.slot);
      case Mem::Space::Shared: return cat("shared memory ", node(m.pos));
      case Mem::Space::Reg: return cat("register ", node(m.pos));
    }
    return "?";
  }
  HostTensor& array(Thread& t, const Mem& m) {
    switch (m.space) {
      case Mem::Space::Global: return *params_[m.slot];
      case Mem::Space::Shared: return shared_[m.id];
      case Mem::Space::Reg: break;
    }
    return t.regs[m.id];
  }
  absl::Status on_read(Thread& t, const Instr& in, const Mem& m, int64_t e);
  // A global element's last write is not ordered before thread t's access: another block
  // wrote it, or another thread of this block since the last barrier.
  bool unordered(const GlobalTrack& g, const Thread& t) const {
    return g.writer >= 0 && (g.block != block_id_ || (g.writer != t.tid && g.epoch == epoch_));
  }
  absl::Status on_write(Thread& t, const Instr& in, const Mem& m, int64_t e);

  const UOp* linear_;
  std::span<HostTensor* const> params_;
  const absl::flat_hash_map<std::string, int64_t>& vars_;
  GpuEmuOptions opts_;
  KernelAbi abi_;
  GpuEmuStats stats_;

  std::vector<Instr> code_;
  std::vector<Mem> mems_;
  absl::flat_hash_map<const UOp*, int> pos_;     // position in the LINEAR
  absl::flat_hash_map<const UOp*, int> mem_of_;  // PARAM / DEFINE_LOCAL / DEFINE_REG -> mems_
  int64_t lanes_ = 0;                            // a thread's value array
  int ranges_ = 0;
  std::vector<ConstValue> defs_;                 // the value array with every definition set
  std::vector<std::pair<int, int>> specials_;    // (offset, which of kSpecials)
  std::vector<int> reg_mems_, shared_mems_;

  // The launch and the block running.
  int64_t block_id_ = 0;  // blocks are numbered x fastest
  int64_t epoch_ = 0;
  std::vector<Thread> threads_;
  std::vector<HostTensor> shared_;
  std::vector<std::vector<SharedTrack>> shared_track_;
  absl::flat_hash_map<int64_t, std::vector<GlobalTrack>> global_track_;  // by slot, written buffers only
};

const UOp* buffer_of(const UOp* b) {
  while (b->is(Op::AFTER)) b = b->src(0);
  return b;
}

absl::Status Emulator::prepare() {
  RETURN_IF_ERROR(verify_for_rendering(linear_, "emulate_gpu"));
  ASSIGN_OR_RETURN(abi_, abi_of(linear_));
  if (abi_.has_thread_range)
    return absl::InvalidArgumentError("a GPU kernel has no Thread range (it is a CPU axis) [emu.launch]");
  code_.resize(linear_->num_src());
  for (int pos = 0; pos < static_cast<int>(linear_->num_src()); ++pos) {
    if (linear_->src(pos)->dtype().count > kMaxLanes)
      return fail(pos, cat("a vector of ", linear_->src(pos)->dtype().count, " lanes, over ", kMaxLanes, " [emu.op]"));
    RETURN_IF_ERROR(prepare_op(pos));
    if (lanes_ > opts_.max_values)
      return absl::ResourceExhaustedError(
          cat("the LINEAR's values need more than ", opts_.max_values, " lanes per thread"));
  }
  int64_t shared_bytes = 0;
  for (int id : shared_mems_) shared_bytes += mems_[id].scalars * scalar_bytes(mems_[id].scalar);
  if (shared_bytes > (48 << 10))
    return absl::InvalidArgumentError(cat(shared_bytes, " bytes of shared memory, over 48 KiB [emu.launch]"));
  return absl::OkStatus();
}

absl::Status Emulator::prepare_op(int pos) {
  const UOp* u = linear_->src(pos);
  Instr& in = code_[pos];
  in.u = u;
  in.pos = pos;
  absl::flat_hash_map<const UOp*, int>& at = pos_;
  at[u] = pos;
  auto slot_of = [&](const UOp* s) { return code_[at.at(s)].out; };
  auto new_value = [&]() {
    in.out = Slot{static_cast<int>(lanes_), static_cast<int>(u->dtype().count)};
    lanes_ += u->dtype().count;
    defs_.resize(lanes_);
  };
  auto value_src = [&](const UOp* s) -> absl::StatusOr<Slot> {
    Slot sl = slot_of(s);
    if (!sl.valid()) return fail(pos, cat("source ", node(at.at(s)), " is not a value"));
    return sl;
  };
  // Each operand is a scalar (used by every lane) or as wide as the result.
  auto lanes_fit = [&](std::vector<Slot> ops, int lanes) -> absl::Status {
    for (const Slot& s : ops)
      if (s.valid() && s.lanes != 1 && s.lanes != lanes)
        return fail(pos, cat("an operand of ", s.lanes, " lanes for ", lanes, " lanes [emu.op]"));
    return absl::OkStatus();
  };
  auto sources_as_values = [&]() -> absl::Status {
    for (const UOp* s : u->src()) {
      ASSIGN_OR_RETURN(Slot sl, value_src(s));
      in.src.push_back(sl);
    }
    return absl::OkStatus();
  };
  const Op op = u->op();
  if (is_alu(op) || op == Op::CAST || op == Op::BITCAST) {
    in.kind = Kind::Alu;
    if (u->num_src() > 3) return fail(pos, cat("has ", u->num_src(), " sources [emu.op]"));
    RETURN_IF_ERROR(sources_as_values());
    new_value();
    return lanes_fit(in.src, in.out.lanes);
  }
  switch (op) {
    case Op::PARAM: case Op::DEFINE_LOCAL: case Op::DEFINE_REG: {
      Mem m;
      m.pos = pos;
      m.scalar = u->dtype().scalar;
      m.count = u->dtype().count;
      int64_t size = op == Op::PARAM ? u->arg_as<ParamArg>().size
                     : op == Op::DEFINE_REG ? u->arg_as<DefineRegArg>().size : u->dtype().size;
      if (size < 0 || size > (int64_t{1} << 40)) return fail(pos, cat("an array of ", size, " elements"));
      m.scalars = size * m.count;
      if (op == Op::PARAM) {
        m.space = Mem::Space::Global;
        m.slot = u->arg_as<ParamArg>().slot;
      } else if (op == Op::DEFINE_LOCAL) {
        m.space = Mem::Space::Shared;
        m.id = static_cast<int>(shared_mems_.size());
        shared_mems_.push_back(static_cast<int>(mems_.size()));
      } else {
        m.space = Mem::Space::Reg;
        m.id = static_cast<int>(reg_mems_.size());
        reg_mems_.push_back(static_cast<int>(mems_.size()));
        if (m.scalars * scalar_bytes(m.scalar) > (64 << 10))
          return fail(pos, "a register array over 64 KiB [emu.launch]");
      }
      mem_of_[u] = static_cast<int>(mems_.size());
      mems_.push_back(m);
      return absl::OkStatus();
    }
    case Op::CONST: case Op::VCONST: {
      std::vector<ConstValue> vals =
          op == Op::CONST ? std::vector<ConstValue>{const_of(u)} : u->arg_as<VConstArg>().values;
      if (vals.empty()) return fail(pos, cat("a constant of dtype ", u->dtype().str()));
      new_value();
      for (int l = 0; l < in.out.lanes; ++l) {
        ConstValue c = vals[vals.size() == 1 ? 0 : l];
        defs_[in.out.off + l] = is_value_of(c, u->dtype().scalar) ? c : cast_value(c, u->dtype().scalar);
      }
      return absl::OkStatus();
    }
    case Op::DEFINE_VAR: {
      const auto& a = u->arg_as<DefineVarArg>();
      auto it = vars_.find(a.name);
      if (it == vars_.end()) return fail(pos, cat("no value is given for the variable '", a.name, "' [emu.launch]"));
      if (it->second < a.min || it->second > a.max)
        return fail(pos, cat("the value ", it->second, " of '", a.name, "' is outside [", a.min, ", ", a.max,
                             "] [emu.launch]"));
      new_value();
      defs_[in.out.off] = cast_value(ConstValue::Int(it->second), u->dtype().scalar);
      return absl::OkStatus();
    }
    case Op::SPECIAL: {
      const std::string& name = u->arg_as<StrArg>().value;
      int which = -1;
      for (int i = 0; i < 6; ++i)
        if (name == kSpecials[i]) which = i;
      if (which < 0) return fail(pos, cat("an unknown SPECIAL '", name, "'"));
      new_value();
      specials_.push_back({in.out.off, which});
      return absl::OkStatus();
    }
    case Op::VECTORIZE: case Op::CAT: case Op::GEP: {
      in.kind = Kind::Gather;
      std::vector<int> lanes;
      for (const UOp* s : u->src()) {
        ASSIGN_OR_RETURN(Slot sl, value_src(s));
        for (int l = 0; l < sl.lanes; ++l) lanes.push_back(sl.off + l);
      }
      if (op == Op::GEP)
        for (int64_t i : u->arg_as<IntsArg>().values) in.gather.push_back(lanes.at(i));
      else
        in.gather = std::move(lanes);
      new_value();
      return absl::OkStatus();
    }
    case Op::INDEX:
      if (u->src(1)->dtype().is_vector()) return fail(pos, "a vector of indices (a gather) [emu.gather]");
      return absl::OkStatus();  // read where it is used
    case Op::LOAD: case Op::STORE: {
      const bool is_load = op == Op::LOAD;
      in.kind = is_load ? Kind::Load : Kind::Store;
      const UOp* index = u->src(is_load ? 1 : 0);
      auto m = mem_of_.find(buffer_of(index->src(0)));
      if (m == mem_of_.end()) return fail(pos, "accesses memory that is not a PARAM, DEFINE_LOCAL or DEFINE_REG");
      in.mem = m->second;
      ASSIGN_OR_RETURN(in.index, value_src(index->src(1)));
      if (index->num_src() > 2) {
        ASSIGN_OR_RETURN(in.gate, value_src(index->src(2)));
      }
      if (u->num_src() > 2 || !is_load) {
        ASSIGN_OR_RETURN(in.data, value_src(u->src(is_load ? 2 : 1)));
      }
      if (is_load) new_value();
      const int lanes = is_load ? in.out.lanes : in.data.lanes;
      if (in.index.lanes != 1) return fail(pos, "a vector of indices (a gather) [emu.gather]");
      return lanes_fit({in.gate, in.data}, lanes);
    }
    case Op::RANGE: {
      in.kind = Kind::Range;
      ASSIGN_OR_RETURN(Slot end, value_src(u->src(0)));
      in.src.push_back(end);
      in.range = ranges_++;
      new_value();
      return absl::OkStatus();
    }
    case Op::END: {
      in.kind = Kind::End;
      for (int k = static_cast<int>(u->num_src()) - 1; k >= 1; --k) {  // innermost first
        Instr& r = code_[at.at(u->src(k))];
        r.jump = pos;
        r.close_at = static_cast<int>(in.closes.size());
        in.closes.push_back(r.pos);
      }
      return absl::OkStatus();
    }
    case Op::IF: {
      in.kind = Kind::If;
      ASSIGN_OR_RETURN(Slot c, value_src(u->src(0)));
      in.src.push_back(c);
      return absl::OkStatus();
    }
    case Op::ENDIF:
      code_[at.at(u->src(0))].jump = pos;
      return absl::OkStatus();
    case Op::AFTER:
      in.out = slot_of(u->src(0));  // its first source (nothing for a buffer)
      return absl::OkStatus();
    case Op::BARRIER:
      in.kind = Kind::Barrier;
      if (u->num_src() > 0 && !u->dtype().is_void()) in.out = slot_of(u->src(0));
      return absl::OkStatus();
    case Op::WMMA: {
      if (!is_mma_m16n8k16(u))
        return fail(pos, "WMMA must be m16n8k16 (a: 8 x f16 / bf16, b: 4 x the same, c and d: 4 x f32) [emu.wmma]");
      in.kind = Kind::Wmma;
      RETURN_IF_ERROR(sources_as_values());
      new_value();
      return absl::OkStatus();
    }
    case Op::SINK: case Op::DEVICE: case Op::GROUP:
      return absl::OkStatus();
    default:
      return fail(pos, cat(op_name(op), " is not supported by the GPU emulator [emu.op]"));
  }
}

// The launch as the worker makes it: variables, buffers, dims.
absl::Status Emulator::bind() {
  for (const KernelParam& p : abi_.params) {
    if (p.slot >= static_cast<int64_t>(params_.size()) || !params_[p.slot])
      return absl::InvalidArgumentError(
          cat("no buffer is bound to slot ", p.slot, " (", params_.size(), " given) [emu.launch]"));
    const HostTensor& t = *params_[p.slot];
    if (t.dtype != p.dtype.scalar || t.numel() < p.size * p.dtype.count || t.nbytes() != t.numel() * t.itemsize())
      return absl::InvalidArgumentError(
          cat("slot ", p.slot, " needs ", p.size, " x ", p.dtype.str(), ", the buffer is ", t.str(0), " [emu.launch]"));
    if (p.written) global_track_[p.slot].assign(p.size * p.dtype.count, GlobalTrack{});
  }
  std::vector<int64_t> values;
  for (const KernelVar& v : abi_.vars) values.push_back(vars_.at(v.name));  // prepare() checked each
  stats_.dims = abi_.eval_gpu(values);
  const GpuDims& d = stats_.dims;
  if (d.empty()) return absl::OkStatus();
  static constexpr int64_t kGrid[3] = {(int64_t{1} << 31) - 1, 65535, 65535}, kBlock[3] = {1024, 1024, 64};
  for (int i = 0; i < 3; ++i) {
    if (d.grid[i] > kGrid[i])
      return absl::InvalidArgumentError(
          cat("grid dim ", std::string(1, "xyz"[i]), " of ", d.grid[i], ", over CUDA's ", kGrid[i], " [emu.launch]"));
    if (d.block[i] > kBlock[i])
      return absl::InvalidArgumentError(cat("block dim ", std::string(1, "xyz"[i]), " of ", d.block[i],
                                            ", over CUDA's ", kBlock[i], " [emu.launch]"));
  }
  if (d.threads_per_block() > 1024)
    return absl::InvalidArgumentError(cat("a block of ", d.threads_per_block(), " threads, over 1024 [emu.launch]"));
  return absl::OkStatus();
}

absl::StatusOr<GpuEmuStats> Emulator::run() {
  RETURN_IF_ERROR(prepare());
  RETURN_IF_ERROR(bind());
  const GpuDims& d = stats_.dims;
  if (d.empty()) return stats_;  // nothing to launch
  int64_t per_thread = lanes_;  // values and register elements, each a ConstValue or less
  for (int id : reg_mems_) per_thread += mems_[id].scalars;
  if (d.threads_per_block() * per_thread > opts_.max_values)
    return absl::ResourceExhaustedError(cat(d.threads_per_block(), " threads of ", per_thread,
                                            " value lanes and register elements each, over ", opts_.max_values,
                                            " in all"));
  threads_.resize(d.threads_per_block());
  for (int64_t tid = 0; tid < d.threads_per_block(); ++tid) {
    Thread& t = threads_[tid];
    t.tid = tid;
    t.idx = {tid % d.block[0], (tid / d.block[0]) % d.block[1], tid / (d.block[0] * d.block[1])};
    t.v = defs_;
    t.ends.assign(ranges_, 0);
    for (int id : reg_mems_) {
      t.regs.push_back(HostTensor::zeros(mems_[id].scalar, {mems_[id].scalars}));
      t.reg_written.emplace_back(mems_[id].scalars, false);
    }
  }
  for (int id : shared_mems_) {
    shared_.push_back(HostTensor::zeros(mems_[id].scalar, {mems_[id].scalars}));
    shared_track_.emplace_back(mems_[id].scalars);
  }
  for (int64_t z = 0; z < d.grid[2]; ++z)
    for (int64_t y = 0; y < d.grid[1]; ++y)
      for (int64_t x = 0; x < d.grid[0]; ++x) {
        RETURN_IF_ERROR(run_block({x, y, z}));
        ++block_id_;
      }
  stats_.blocks = block_id_;
  return stats_;
}

absl::Status Emulator::run_block(const std::array<int64_t, 3>& b) {
  epoch_ = 0;
  for (auto& track : shared_track_) std::fill(track.begin(), track.end(), SharedTrack{});
  for (Thread& t : threads_) {
    t.pc = 0;
    t.state = Thread::State::Running;
    for (auto [off, which] : specials_) t.v[off] = ConstValue::Int(which < 3 ? b[which] : t.idx[which - 3]);
    for (auto& w : t.reg_written) std::fill(w.begin(), w.end(), false);
  }
  const int64_t n = static_cast<int64_t>(threads_.size());
  stats_.steps += n;  // a thread's start counts as an op: a huge grid of empty blocks ends too
  if (stats_.steps > opts_.max_steps)
    return absl::ResourceExhaustedError(cat("the launch ran more than ", opts_.max_steps, " ops"));
  while (true) {
    for (Thread& t : threads_)
      if (t.state == Thread::State::Running) RETURN_IF_ERROR(run_thread(t));
    // Warps whose threads wait at a WMMA run it; then the barrier, once all threads wait.
    bool ran = false;
    for (int64_t w = 0; w * 32 < n; ++w) {
      std::span<Thread> warp(threads_.data() + w * 32, static_cast<size_t>(std::min<int64_t>(32, n - w * 32)));
      auto at_wmma =
          std::find_if(warp.begin(), warp.end(), [](const Thread& t) { return t.state == Thread::State::AtWmma; });
      if (at_wmma == warp.end()) continue;
      RETURN_IF_ERROR(run_wmma(code_[at_wmma->pc], warp));
      ran = true;
    }
    if (ran) continue;
    const Thread* waiting = nullptr;
    const Thread* ended = nullptr;
    for (const Thread& t : threads_) {
      if (t.state == Thread::State::Done) {
        if (!ended) ended = &t;
        continue;
      }
      if (!waiting) waiting = &t;
      else if (t.pc != waiting->pc)
        return fail(waiting->pc, cat(who(*waiting), " waits here while ", who(t), " waits at ", node(t.pc),
                                     ": a barrier some threads skip [emu.barrier]"));
    }
    if (!waiting) return absl::OkStatus();  // every thread ended
    if (ended)
      return fail(waiting->pc, cat(who(*waiting), " waits here but ", who(*ended),
                                   " ended without reaching it: a barrier some threads skip [emu.barrier]"));
    ++epoch_;
    ++stats_.barriers;
    for (Thread& t : threads_) {
      t.state = Thread::State::Running;
      ++t.pc;
    }
  }
}

absl::Status Emulator::run_thread(Thread& t) {
  const int n = static_cast<int>(code_.size());
  while (t.pc < n) {
    const Instr& in = code_[t.pc];
    if (++stats_.steps > opts_.max_steps)
      return absl::ResourceExhaustedError(cat(node(t.pc), ": the launch ran more than ", opts_.max_steps, " ops"));
    switch (in.kind) {
      case Kind::Nop: break;
      case Kind::Alu: {
        ConstValue args[3];
        const size_t ns = in.src.size();
        for (int l = 0; l < in.out.lanes; ++l) {
          for (size_t k = 0; k < ns; ++k) args[k] = t.v[in.src[k].at(l)];
          std::optional<ConstValue> r = apply_scalar_op(in.u, std::span<const ConstValue>(args, ns));
          if (!r) return fail(t.pc, cat("not defined on ", in.u->src(0)->dtype().str()));
          t.v[in.out.off + l] = *r;
        }
        break;
      }
      case Kind::Gather:
        for (int l = 0; l < in.out.lanes; ++l) t.v[in.out.off + l] = t.v[in.gather[l]];
        break;
      case Kind::Load: RETURN_IF_ERROR(load(t, in)); break;
      case Kind::Store: RETURN_IF_ERROR(store(t, in)); break;
      case Kind::Range: {
        const int64_t end = t.v[in.src[0].off].to_int();
        if (end <= 0) {  // an empty loop: on to the END, which moves the loops outside it
          advance(t, code_[in.jump], in.close_at + 1);
          continue;
        }
        t.v[in.out.off] = ConstValue::Int(0);
        t.ends[in.range] = end;
        break;
      }
      case Kind::End: advance(t, in, 0); continue;
      case Kind::If:
        if (!t.v[in.src[0].off].as_bool()) {
          t.pc = in.jump;  // the ENDIF, a no-op
          continue;
        }
        break;
      case Kind::Barrier: t.state = Thread::State::AtBarrier; return absl::OkStatus();
      case Kind::Wmma: t.state = Thread::State::AtWmma; return absl::OkStatus();
    }
    ++t.pc;
  }
  t.state = Thread::State::Done;
  return absl::OkStatus();
}

// END's loops, innermost first from `from`: the first that has iterations left goes on
// with its body, else past the END.
void Emulator::advance(Thread& t, const Instr& end, int from) {
  for (size_t j = from; j < end.closes.size(); ++j) {
    const Instr& r = code_[end.closes[j]];
    const int64_t next = t.v[r.out.off].as_int() + 1;
    t.v[r.out.off] = ConstValue::Int(next);
    if (next < t.ends[r.range]) {
      t.pc = r.pos + 1;
      return;
    }
  }
  t.pc = end.pos + 1;
}

absl::Status Emulator::on_read(Thread& t, const Instr& in, const Mem& m, int64_t e) {
  switch (m.space) {
    case Mem::Space::Reg:
      if (!t.reg_written[m.id][e])
        return fail(in.pos,
                    cat(who(t), " reads element ", e, " of ", mem_name(m), ", which it never wrote [emu.uninit]"));
      return absl::OkStatus();
    case Mem::Space::Shared: {
      SharedTrack& s = shared_track_[m.id][e];
      if (s.write_epoch < 0)
        return fail(in.pos, cat(who(t), " reads element ", e, " of ", mem_name(m),
                                ", which no thread has written [emu.uninit]"));
      if (s.write_epoch == epoch_ && s.writer != t.tid)
        return fail(in.pos, cat(who(t), " reads element ", e, " of ", mem_name(m), ", which ", thread_name(s.writer),
                                " wrote with no barrier between [emu.race]"));
      if (s.read_epoch != epoch_) {
        s.read_epoch = epoch_;
        s.readers[0] = t.tid, s.readers[1] = -1;
      } else if (s.readers[0] != t.tid && s.readers[1] < 0) {
        s.readers[1] = t.tid;
      }
      return absl::OkStatus();
    }
    case Mem::Space::Global: {
      auto it = global_track_.find(m.slot);
      if (it == global_track_.end()) return absl::OkStatus();
      const GlobalTrack& g = it->second[e];
      if (unordered(g, t))
        return fail(in.pos, cat(who(t), " reads element ", e, " of ", mem_name(m), ", which ",
                                thread_name(g.writer, g.block), " wrote with no barrier between [emu.race]"));
      return absl::OkStatus();
    }
  }
  return absl::OkStatus();
}

absl::Status Emulator::on_write(Thread& t, const Instr& in, const Mem& m, int64_t e) {
  switch (m.space) {
    case Mem::Space::Reg:
      t.reg_written[m.id][e] = true;
      return absl::OkStatus();
    case Mem::Space::Shared: {
      SharedTrack& s = shared_track_[m.id][e];
      if (s.write_epoch == epoch_ && s.writer != t.tid)
        return fail(in.pos, cat(who(t), " writes element ", e, " of ", mem_name(m), ", which ", thread_name(s.writer),
                                " wrote with no barrier between [emu.race]"));
      if (s.read_epoch == epoch_)
        for (int64_t r : s.readers)
          if (r >= 0 && r != t.tid)
            return fail(in.pos, cat(who(t), " writes element ", e, " of ", mem_name(m), ", which ", thread_name(r),
                                    " read with no barrier between [emu.race]"));
      s.write_epoch = epoch_;
      s.writer = t.tid;
      return absl::OkStatus();
    }
    case Mem::Space::Global: {
      GlobalTrack& g = global_track_.at(m.slot)[e];
      if (unordered(g, t))
        return fail(in.pos, cat(who(t), " writes element ", e, " of ", mem_name(m), ", which ",
                                thread_name(g.writer, g.block), " wrote with no barrier between [emu.race]"));
      g = GlobalTrack{t.tid, block_id_, epoch_};
      return absl::OkStatus();
    }
  }
  return absl::OkStatus();
}

absl::Status Emulator::load(Thread& t, const Instr& in) {
  const Mem& m = mems_[in.mem];
  const uint64_t base = static_cast<uint64_t>(t.v[in.index.off].to_int()) * static_cast<uint64_t>(m.count);
  const Scalar s = in.u->dtype().scalar;
  for (int l = 0; l < in.out.lanes; ++l) {
    ConstValue& out = t.v[in.out.off + l];
    if (in.gate.valid() && !t.v[in.gate.at(l)].as_bool()) {  // no memory is touched
      out = in.data.valid() ? t.v[in.data.at(l)] : cast_value(ConstValue::Int(0), s);
      continue;
    }
    const int64_t e = static_cast<int64_t>(base + l);
    if (e < 0 || e >= m.scalars)
      return fail(in.pos,
                  cat(who(t), " reads element ", e, " of ", mem_name(m), ", which holds ", m.scalars, " [emu.bounds]"));
    RETURN_IF_ERROR(on_read(t, in, m, e));
    out = array(t, m).get(e);
  }
  return absl::OkStatus();
}

absl::Status Emulator::store(Thread& t, const Instr& in) {
  const Mem& m = mems_[in.mem];
  const uint64_t base = static_cast<uint64_t>(t.v[in.index.off].to_int()) * static_cast<uint64_t>(m.count);
  for (int l = 0; l < in.data.lanes; ++l) {
    if (in.gate.valid() && !t.v[in.gate.at(l)].as_bool()) continue;
    const int64_t e = static_cast<int64_t>(base + l);
    if (e < 0 || e >= m.scalars)
      return fail(in.pos, cat(who(t), " writes element ", e, " of ", mem_name(m), ", which holds ", m.scalars,
                              " [emu.bounds]"));
    RETURN_IF_ERROR(on_write(t, in, m, e));
    array(t, m).set(e, t.v[in.data.off + l]);
  }
  return absl::OkStatus();
}

// mma.sync m16n8k16 for one warp, in the fragment layout of gpu_emu.h.
absl::Status Emulator::run_wmma(const Instr& in, std::span<Thread> warp) {
  if (warp.size() != 32)
    return fail(in.pos,
                cat(who(warp[0]), " waits here in a warp of ", warp.size(), " threads; a WMMA needs 32 [emu.wmma]"));
  for (const Thread& t : warp)
    if (t.state != Thread::State::AtWmma || t.pc != in.pos)
      return fail(in.pos, cat(who(warp[0]), " waits here but ", who(t), " of its warp ",
                              t.state == Thread::State::Done ? std::string("ended") : cat("waits at ", node(t.pc)),
                              ": a WMMA needs all 32 threads of the warp [emu.wmma]"));
  ConstValue A[16][16], B[16][8], C[16][8];
  for (int lane = 0; lane < 32; ++lane) {
    const std::vector<ConstValue>& v = warp[lane].v;
    const int g = lane / 4, q = lane % 4;
    for (int e = 0; e < 8; ++e)
      A[g + 8 * ((e >> 1) & 1)][2 * q + (e & 1) + 8 * (e >> 2)] = cast_value(v[in.src[0].off + e], Scalar::Float32);
    for (int e = 0; e < 4; ++e)
      B[2 * q + (e & 1) + 8 * (e >> 1)][g] = cast_value(v[in.src[1].off + e], Scalar::Float32);
    for (int e = 0; e < 4; ++e) C[g + 8 * (e >> 1)][2 * q + (e & 1)] = v[in.src[2].off + e];
  }
  for (int lane = 0; lane < 32; ++lane) {
    Thread& t = warp[lane];
    const int g = lane / 4, q = lane % 4;
    for (int e = 0; e < 4; ++e) {
      const int r = g + 8 * (e >> 1), c = 2 * q + (e & 1);
      ConstValue acc = C[r][c];
      for (int k = 0; k < 16; ++k) {
        const ConstValue args[3] = {A[r][k], B[k][c], acc};
        acc = *eval_alu(Op::MULACC, Scalar::Float32, args);
      }
      t.v[in.out.off + e] = acc;
    }
    t.state = Thread::State::Running;
    ++t.pc;
  }
  ++stats_.wmmas;
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<GpuEmuStats> emulate_gpu(const UOp* linear, std::span<HostTensor* const> params,
                                        const absl::flat_hash_map<std::string, int64_t>& vars,
                                        const GpuEmuOptions& options) {
  return Emulator(linear, params, vars, options).run();
}

}  // namespace uop
