// The tensor frontend (client/tensor.h): ops against values worked out by hand and against
// the reference interpreter, compiled through LocalRealizer (the whole pipeline in this
// process); gradients (autograd.h) against central finite differences in float64; and
// the multi-device ops shard() / to() realized on 2 and 3 CPU devices against the same
// computation on one device.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "client/autograd.h"
#include "client/realize.h"
#include "client/tensor.h"
#include "compiler/support/strings.h"
#include "local/local_realizer.h"

namespace uop::client {
namespace {

LocalRunner& runner() {
  static LocalRunner r(2);
  return r;
}

HostTensor host(Scalar dt, std::vector<int64_t> shape, const std::vector<double>& v) {
  HostTensor h = HostTensor::zeros(dt, std::move(shape));
  EXPECT_EQ(static_cast<size_t>(h.numel()), v.size());
  for (int64_t i = 0; i < h.numel(); ++i) h.set(i, ConstValue::Float(v[i]));
  return h;
}

// Seeded values in [lo, hi).
HostTensor randn(Scalar dt, std::vector<int64_t> shape, uint64_t seed, double lo = -2, double hi = 2) {
  return Tensor::uniform(std::move(shape), lo, hi, seed, dt, "CPU:0", TensorContext::make()).to_host().value();
}

// Realized through the compiler; the tensor becomes a leaf.
HostTensor compiled(const Tensor& t) {
  LocalRealizer r(runner());
  absl::Status st = t.realize(r);
  EXPECT_TRUE(st.ok()) << st;
  auto h = t.to_host();
  EXPECT_TRUE(h.ok()) << h.status();
  return h.ok() ? *h : HostTensor{};
}
HostTensor interpreted(const Tensor& t) {
  InterpRealizer r;
  absl::Status st = t.realize(r);
  EXPECT_TRUE(st.ok()) << st;
  auto h = t.to_host();
  EXPECT_TRUE(h.ok()) << h.status();
  return h.ok() ? *h : HostTensor{};
}

void expect_close(const HostTensor& want, const HostTensor& got, Tolerance tol, const std::string& what = "") {
  CompareResult c = compare(want, got, tol);
  EXPECT_TRUE(c.ok) << what << ": " << c.message << "\nwant " << want.str() << "\ngot  " << got.str();
}

// Builds a tensor expression from fresh leaves of `inputs` (in a new context each time, so
// the compiled and interpreted runs do not share realized nodes).
using Build = std::function<Tensor(const std::vector<Tensor>&)>;
std::vector<Tensor> leaves(const std::vector<HostTensor>& inputs, const std::string& device = "CPU:0") {
  ContextPtr ctx = TensorContext::make();
  std::vector<Tensor> xs;
  for (const HostTensor& h : inputs) xs.push_back(Tensor::from(h, device, ctx));
  return xs;
}

// Compiled against interpreted, and against `want` when given.
void check_op(const Build& f, const std::vector<HostTensor>& inputs, const HostTensor* want = nullptr,
              Tolerance tol = Tolerance::for_dtype(Scalar::Float32)) {
  HostTensor got = compiled(f(leaves(inputs)));
  HostTensor ref = interpreted(f(leaves(inputs)));
  expect_close(ref, got, tol, "compiled vs interpreter");
  if (want) expect_close(*want, got, tol, "compiled vs hand-computed");
}

// ---------------------------------------------------------------------------------------
// Forward values

TEST(TensorOps, ElementwiseBroadcasting) {
  HostTensor a = host(Scalar::Float32, {2, 3}, {1, 2, 3, 4, 5, 6});
  HostTensor b = host(Scalar::Float32, {3}, {10, 20, 30});
  HostTensor c = host(Scalar::Float32, {2, 1}, {-1, 2});
  HostTensor want = host(Scalar::Float32, {2, 3}, {(1 + 10) * -1.0, (2 + 20) * -1.0, (3 + 30) * -1.0,
                                                   (4 + 10) * 2.0, (5 + 20) * 2.0, (6 + 30) * 2.0});
  check_op([](const auto& x) { return (x[0] + x[1]) * x[2]; }, {a, b, c}, &want);
  HostTensor want2 = host(Scalar::Float32, {2, 3}, {1 - 0.5, 2 - 0.5, 3 - 0.5, 4 - 0.5, 5 - 0.5, 6 - 0.5});
  check_op([](const auto& x) { return x[0] - 0.5; }, {a}, &want2);
  HostTensor want3 = host(Scalar::Float32, {2, 3}, {1 / 10.0, 2 / 20.0, 3 / 30.0, 4 / 10.0, 5 / 20.0, 6 / 30.0});
  check_op([](const auto& x) { return x[0] / x[1]; }, {a, b}, &want3);
  HostTensor want4 = host(Scalar::Float32, {2, 3}, {1, 1, 1, 3, 3, 3});  // max(min(a, c + 1), 1)
  check_op([](const auto& x) { return x[0].minimum(x[2] + 1.0 + 0.0 * x[0]).maximum(Tensor::full({}, 1, Scalar::Float32, x[0].context())); },
           {a, b, c}, &want4);
  // Integers: / is floor-free IDIV, comparisons give bool.
  HostTensor ia = host(Scalar::Int32, {4}, {7, -7, 9, 0});
  HostTensor ib = host(Scalar::Int32, {1}, {2});
  HostTensor iwant = host(Scalar::Int32, {4}, {3, -3, 4, 0});
  check_op([](const auto& x) { return x[0] / x[1]; }, {ia, ib}, &iwant);
  HostTensor bwant = host(Scalar::Bool, {4}, {0, 1, 0, 1});
  check_op([](const auto& x) { return x[0].lt(x[1]); }, {ia, ib}, &bwant);
  check_op([](const auto& x) { return x[0].ge(x[1]).cast(Scalar::Int32) + x[0].eq(x[1]).cast(Scalar::Int32); },
           {ia, ib});
}

TEST(TensorOps, UnaryAndActivations) {
  HostTensor x = host(Scalar::Float32, {5}, {-2, -0.5, 0.25, 1, 3});
  std::vector<double> relu, sig, th, ex, lg;
  for (double v : {-2.0, -0.5, 0.25, 1.0, 3.0}) {
    relu.push_back(std::max(v, 0.0));
    sig.push_back(1 / (1 + std::exp(-v)));
    th.push_back(std::tanh(v));
    ex.push_back(std::exp(v));
    lg.push_back(std::log(std::abs(v)));
  }
  Tolerance loose{1e-5, 1e-6, 0};
  HostTensor w = host(Scalar::Float32, {5}, relu);
  check_op([](const auto& a) { return a[0].relu(); }, {x}, &w, loose);
  w = host(Scalar::Float32, {5}, sig);
  check_op([](const auto& a) { return a[0].sigmoid(); }, {x}, &w, loose);
  w = host(Scalar::Float32, {5}, th);
  check_op([](const auto& a) { return a[0].tanh(); }, {x}, &w, loose);
  w = host(Scalar::Float32, {5}, ex);
  check_op([](const auto& a) { return a[0].exp(); }, {x}, &w, loose);
  w = host(Scalar::Float32, {5}, lg);
  check_op([](const auto& a) { return (a[0] * a[0]).sqrt().log(); }, {x}, &w, loose);
  check_op([](const auto& a) { return -a[0].reciprocal() + a[0].square(); }, {x});
  check_op([](const auto& a) { return where(a[0].gt(Tensor::full({}, 0, Scalar::Float32, a[0].context())), a[0], a[0] * 3.0); },
           {x});
}

TEST(TensorOps, ReductionsAndMatmul) {
  HostTensor a = host(Scalar::Float32, {2, 3}, {1, -2, 3, 4, 5, -6});
  HostTensor w;
  w = host(Scalar::Float32, {}, {5});
  check_op([](const auto& x) { return x[0].sum(); }, {a}, &w);
  w = host(Scalar::Float32, {3}, {5, 3, -3});
  check_op([](const auto& x) { return x[0].sum({0}); }, {a}, &w);
  w = host(Scalar::Float32, {2, 1}, {3, 5});
  check_op([](const auto& x) { return x[0].max({-1}, true); }, {a}, &w);
  w = host(Scalar::Float32, {2}, {2.0 / 3, 1});
  check_op([](const auto& x) { return x[0].mean({1}); }, {a}, &w);
  // [2, 3] @ [3, 2]
  HostTensor b = host(Scalar::Float32, {3, 2}, {1, 0, 0, 1, 2, -1});
  w = host(Scalar::Float32, {2, 2}, {1 + 6, -2 - 3, 4 - 12, 5 + 6});
  check_op([](const auto& x) { return x[0].matmul(x[1]); }, {a, b}, &w);
  // Batched, with a broadcast batch dim.
  HostTensor c = randn(Scalar::Float32, {4, 2, 3}, 5);
  check_op([](const auto& x) { return x[0].matmul(x[1]); }, {c, b});
}

TEST(TensorOps, Movement) {
  HostTensor a = host(Scalar::Float32, {2, 3}, {0, 1, 2, 3, 4, 5});
  HostTensor w;
  w = host(Scalar::Float32, {3, 2}, {0, 1, 2, 3, 4, 5});
  check_op([](const auto& x) { return x[0].reshape({3, -1}); }, {a}, &w);
  w = host(Scalar::Float32, {3, 2}, {0, 3, 1, 4, 2, 5});
  check_op([](const auto& x) { return x[0].permute({1, 0}); }, {a}, &w);
  check_op([](const auto& x) { return x[0].transpose(); }, {a}, &w);
  w = host(Scalar::Float32, {2, 2, 3}, {0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 4, 5});
  check_op([](const auto& x) { return x[0].expand({2, 2, 3}); }, {a}, &w);
  w = host(Scalar::Float32, {3, 4}, {0, 0, 0, 0, 0, 0, 1, 2, 0, 3, 4, 5});
  check_op([](const auto& x) { return x[0].pad({1, 1}, {0, 0}); }, {a}, &w);
  w = host(Scalar::Float32, {1, 2}, {4, 5});
  check_op([](const auto& x) { return x[0].shrink({1, 1}, {2, 3}); }, {a}, &w);
  w = host(Scalar::Float32, {2, 3}, {5, 4, 3, 2, 1, 0});
  check_op([](const auto& x) { return x[0].flip({0, 1}); }, {a}, &w);
  // Size-1 and odd shapes.
  HostTensor one = host(Scalar::Float32, {1, 1}, {7});
  w = host(Scalar::Float32, {3, 1}, {7, 7, 7});
  check_op([](const auto& x) { return x[0].expand({3, 1}); }, {one}, &w);
}

TEST(TensorOps, SoftmaxAndCrossEntropy) {
  HostTensor a = host(Scalar::Float32, {2, 3}, {1, 2, 3, -1, 0, 5});
  std::vector<double> sm, lsm;
  for (int r = 0; r < 2; ++r) {
    double m = r ? 5 : 3, s = 0;
    for (int c = 0; c < 3; ++c) s += std::exp(a.get(r * 3 + c).as_float() - m);
    for (int c = 0; c < 3; ++c) {
      const double v = a.get(r * 3 + c).as_float() - m;
      sm.push_back(std::exp(v) / s);
      lsm.push_back(v - std::log(s));
    }
  }
  Tolerance loose{1e-5, 1e-6, 0};
  HostTensor w = host(Scalar::Float32, {2, 3}, sm);
  check_op([](const auto& x) { return x[0].softmax(); }, {a}, &w, loose);
  w = host(Scalar::Float32, {2, 3}, lsm);
  check_op([](const auto& x) { return x[0].log_softmax(1); }, {a}, &w, loose);
  // Labels 2 and 0: the loss is -(lsm[0][2] + lsm[1][0]) / 2.
  w = host(Scalar::Float32, {}, {-(lsm[2] + lsm[3]) / 2});
  HostTensor labels = host(Scalar::Int32, {2}, {2, 0});
  check_op([](const auto& x) { return cross_entropy(x[0], x[1]); }, {a, labels}, &w, loose);
  HostTensor onehot = host(Scalar::Float32, {2, 3}, {0, 0, 1, 1, 0, 0});
  check_op([](const auto& x) { return cross_entropy(x[0], x[1]); }, {a, onehot}, &w, loose);
}

// ---------------------------------------------------------------------------------------
// Gradients against central finite differences (float64)

// loss(x...) = sum(f(x...) * r) for a fixed random r, so every output element weighs in
// differently; each input's gradient from autograd (compiled) against
// (loss(x + h e_i) - loss(x - h e_i)) / 2h (interpreted).
void check_grad(const Build& f, const std::vector<HostTensor>& inputs, double tol = 1e-6) {
  const double h = 1e-6;
  auto loss_of = [&](const std::vector<Tensor>& xs) {
    Tensor y = f(xs);
    Tensor r = Tensor::uniform(y.shape(), 0.5, 1.5, 99, Scalar::Float64, "CPU:0", y.context());
    return (y * r).sum();
  };
  std::vector<Tensor> xs = leaves(inputs);
  Tensor loss = loss_of(xs);
  std::vector<Tensor> grads = gradients(loss, xs);
  for (size_t k = 0; k < inputs.size(); ++k) {
    if (!scalar_is_float(inputs[k].dtype)) continue;
    HostTensor g = compiled(grads[k]);
    ASSERT_EQ(g.shape, inputs[k].shape);
    for (int64_t i = 0; i < inputs[k].numel(); ++i) {
      auto at = [&](double delta) {
        std::vector<HostTensor> in = inputs;
        in[k].set(i, ConstValue::Float(in[k].get(i).as_float() + delta));
        return interpreted(loss_of(leaves(in))).get(0).as_float();
      };
      const double fd = (at(h) - at(-h)) / (2 * h);
      const double an = g.get(i).as_float();
      EXPECT_NEAR(an, fd, tol * std::max(1.0, std::abs(fd))) << "input " << k << " element " << i;
    }
  }
}

const Scalar F64 = Scalar::Float64;

TEST(TensorGrad, Arithmetic) {
  HostTensor a = randn(F64, {2, 3}, 1), b = randn(F64, {3}, 2), c = randn(F64, {2, 1}, 3, 0.5, 2);
  check_grad([](const auto& x) { return (x[0] + x[1]) * x[2]; }, {a, b, c});
  check_grad([](const auto& x) { return x[0] - x[1]; }, {a, b});
  check_grad([](const auto& x) { return x[0] / x[1]; }, {a, c});
  check_grad([](const auto& x) { return -x[0] * 3.0 + 1.0 / x[1]; }, {a, c});
}

TEST(TensorGrad, Unary) {
  HostTensor a = randn(F64, {2, 3}, 4);
  HostTensor pos = randn(F64, {2, 3}, 5, 0.5, 3);
  check_grad([](const auto& x) { return x[0].exp(); }, {a});
  check_grad([](const auto& x) { return x[0].log(); }, {pos});
  check_grad([](const auto& x) { return x[0].sqrt(); }, {pos});
  check_grad([](const auto& x) { return x[0].reciprocal(); }, {pos});
  check_grad([](const auto& x) { return x[0].square(); }, {a});
  check_grad([](const auto& x) { return x[0].relu(); }, {a});
  check_grad([](const auto& x) { return x[0].sigmoid(); }, {a});
  check_grad([](const auto& x) { return x[0].tanh(); }, {a});
  check_grad([](const auto& x) { return x[0].exp2() + x[1].log2(); }, {a, pos});
}

TEST(TensorGrad, MaxMinWhere) {
  HostTensor a = randn(F64, {2, 3}, 6), b = randn(F64, {2, 3}, 7);
  check_grad([](const auto& x) { return x[0].maximum(x[1]); }, {a, b});
  check_grad([](const auto& x) { return x[0].minimum(x[1]); }, {a, b});
  check_grad([](const auto& x) { return where(x[0].lt(x[1]), x[0] * x[1], x[1] * 2.0); }, {a, b});
}

TEST(TensorGrad, Reductions) {
  HostTensor a = randn(F64, {3, 4}, 8);
  check_grad([](const auto& x) { return x[0].sum(); }, {a});
  check_grad([](const auto& x) { return x[0].sum({0}, true) * x[0]; }, {a});
  check_grad([](const auto& x) { return x[0].max({1}); }, {a});
  check_grad([](const auto& x) { return x[0].max(); }, {a});
  check_grad([](const auto& x) { return x[0].mean({-1}, true); }, {a});
}

TEST(TensorGrad, Matmul) {
  HostTensor a = randn(F64, {3, 4}, 9), b = randn(F64, {4, 2}, 10), c = randn(F64, {2, 3, 4}, 11);
  check_grad([](const auto& x) { return x[0].matmul(x[1]); }, {a, b});
  check_grad([](const auto& x) { return x[0].matmul(x[1]); }, {c, b});  // batch broadcast
}

TEST(TensorGrad, Movement) {
  HostTensor a = randn(F64, {2, 3}, 12);
  HostTensor col = randn(F64, {3, 1}, 13);
  check_grad([](const auto& x) { return x[0].reshape({3, 2}); }, {a});
  check_grad([](const auto& x) { return x[0].permute({1, 0}); }, {a});
  check_grad([](const auto& x) { return x[0].expand({3, 4}); }, {col});
  check_grad([](const auto& x) { return x[0].pad({1, 0}, {2, 1}); }, {a});
  check_grad([](const auto& x) { return x[0].shrink({0, 1}, {1, 3}); }, {a});
  check_grad([](const auto& x) { return x[0].flip({1}); }, {a});
  check_grad([](const auto& x) { return x[0].contiguous() * 2.0; }, {a});
  // No gradient through detach: d/dx sum(x * detach(x)) is detach(x), i.e. x's values.
  std::vector<Tensor> xs = leaves({a});
  expect_close(a, compiled(gradients((xs[0] * xs[0].detach()).sum(), xs)[0]), Tolerance::exact(), "detach");
}

TEST(TensorGrad, SoftmaxFamily) {
  HostTensor a = randn(F64, {3, 4}, 14);
  check_grad([](const auto& x) { return x[0].softmax(); }, {a});
  check_grad([](const auto& x) { return x[0].log_softmax(0); }, {a});
  HostTensor onehot = host(F64, {3, 4}, {0, 1, 0, 0, 0, 0, 0, 1, 1, 0, 0, 0});
  HostTensor labels = host(Scalar::Int32, {3}, {1, 3, 0});
  check_grad([](const auto& x) { return cross_entropy(x[0], x[1]); }, {a, onehot});
  check_grad([](const auto& x) { return cross_entropy(x[0], x[1]); }, {a, labels});
}

TEST(TensorGrad, BackwardAccumulates) {
  ContextPtr ctx = TensorContext::make();
  Tensor w = Tensor::from(host(F64, {2}, {1, 2}), "CPU:0", ctx);
  w.requires_grad_();
  (w * w).sum().backward();
  (w * 3.0).sum().backward();
  HostTensor g = compiled(w.grad());
  expect_close(host(F64, {2}, {2 * 1 + 3, 2 * 2 + 3}), g, Tolerance::exact());
}

// ---------------------------------------------------------------------------------------
// Multi-device: shard() and to()

std::vector<std::string> devices(int n) {
  std::vector<std::string> d;
  for (int i = 0; i < n; ++i) d.push_back(cat("CPU:", i));
  return d;
}

class TensorMulti : public testing::TestWithParam<int> {};

TEST_P(TensorMulti, ShardBuildsMultiAndToBuildsCopy) {
  const auto d = devices(GetParam());
  ContextPtr ctx = TensorContext::make();
  Tensor x = Tensor::from(randn(Scalar::Float32, {5, 3}, 20), "CPU:0", ctx);
  Tensor xs = x.shard(d, 0);  // host data: cut and uploaded per device
  ASSERT_EQ(xs.node()->op(), Op::MULTI);
  EXPECT_EQ(xs.node()->arg_as<IntArg>().value, 0);
  EXPECT_EQ(xs.node()->num_src(), d.size());
  EXPECT_EQ(xs.placement().splits, (GetParam() == 2 ? std::vector<int64_t>{3, 2} : std::vector<int64_t>{2, 2, 1}));
  Tensor lazy = (x * 2.0).shard(d, 1);  // a lazy value: shrinks and copies per device
  ASSERT_EQ(lazy.node()->op(), Op::MULTI);
  for (size_t i = 1; i < d.size(); ++i) EXPECT_EQ(lazy.node()->src(i)->op(), Op::COPY);
  Tensor rep = (x + 1.0).shard(d, -1);
  ASSERT_EQ(rep.node()->op(), Op::MULTI);
  EXPECT_EQ(rep.node()->arg_as<IntArg>().value, -1);
  Tensor moved = x.to(d[1]);
  ASSERT_EQ(moved.node()->op(), Op::COPY);
  EXPECT_EQ(moved.placement().devices, std::vector<std::string>{d[1]});
}

// The same computation on one device and on several: shard(), ops on MULTIs (elementwise
// with a replicated operand, reductions over and beside the shard axis, matmul, movement
// that gathers), to() gathering back.
TEST_P(TensorMulti, ShardedMatchesSingleDevice) {
  const auto d = devices(GetParam());
  for (int64_t rows : {int64_t{GetParam()}, int64_t{7}}) {
    SCOPED_TRACE(cat("rows ", rows));
    HostTensor xh = randn(Scalar::Float32, {rows, 3}, 21), wh = randn(Scalar::Float32, {3, 4}, 22);
    auto build = [&](bool multi) {
      ContextPtr ctx = TensorContext::make();
      Tensor x = Tensor::from(xh, "CPU:0", ctx), w = Tensor::from(wh, "CPU:0", ctx);
      if (multi) {
        x = x.shard(d, 0);
        w = w.shard(d, -1);
      }
      Tensor y = x.matmul(w).relu() + 1.0;        // sharded on rows
      Tensor s = y.sum({0});                       // over the shard axis: replicated
      Tensor m = y.max({1}, true);                 // beside it: stays sharded
      Tensor t = y.transpose().reshape({-1});      // touches the shard axis: gathered
      std::vector<Tensor> outs{y, s, m, (y - m).to(d[0]), t, y.softmax(0)};
      return outs;
    };
    std::vector<Tensor> one = build(false), many = build(true);
    for (size_t i = 0; i < one.size(); ++i) {
      SCOPED_TRACE(cat("output ", i));
      HostTensor want = interpreted(one[i]);
      HostTensor got = compiled(many[i]);
      expect_close(want, got, Tolerance{1e-5, 1e-5, 0});
    }
    // The interpreter realizes MULTIs as well.
    std::vector<Tensor> again = build(true);
    expect_close(interpreted(one[0]), interpreted(again[0]), Tolerance{1e-5, 1e-5, 0});
  }
}

// A data-parallel training step: the batch sharded, the weight replicated; the weight's
// gradient (summed over the batch by an ALLREDUCE) equals the single-device one.
TEST_P(TensorMulti, DataParallelGradient) {
  const auto d = devices(GetParam());
  const int64_t n = 5;
  HostTensor xh = randn(Scalar::Float32, {n, 3}, 30), wh = randn(Scalar::Float32, {3, 4}, 31);
  HostTensor labels = host(Scalar::Int32, {n}, {0, 3, 1, 2, 3});
  auto step = [&](bool multi) {
    ContextPtr ctx = TensorContext::make();
    Tensor x = Tensor::from(xh, "CPU:0", ctx), w = Tensor::from(wh, "CPU:0", ctx);
    Tensor y = Tensor::from(labels, "CPU:0", ctx);
    if (multi) {
      x = x.shard(d, 0);
      y = y.shard(d, 0);
      w = w.shard(d, -1);
    }
    w.requires_grad_();
    Tensor loss = cross_entropy(x.matmul(w), y);
    loss.backward();
    Tensor w_next = (w - w.grad() * 0.1).detach();
    LocalRealizer r(runner());
    absl::Status st = realize_all({loss, w.grad(), w_next}, r);
    EXPECT_TRUE(st.ok()) << st;
    return std::vector<HostTensor>{loss.to_host().value(), w.grad().to_host().value(), w_next.to_host().value()};
  };
  std::vector<HostTensor> one = step(false), many = step(true);
  for (size_t i = 0; i < one.size(); ++i) expect_close(one[i], many[i], Tolerance{1e-5, 1e-6, 0}, cat("result ", i));
}

// Gradients through shard() of single-device tensors that require them: the relayout
// sends each gradient back to the tensor it came from (a replicated one's from its own
// replica, a sharded one's gathered with COPY), matching finite-difference-free
// single-device gradients.
TEST_P(TensorMulti, GradientThroughShard) {
  const auto d = devices(GetParam());
  HostTensor xh = randn(Scalar::Float64, {5, 3}, 40), wh = randn(Scalar::Float64, {3, 2}, 41);
  auto grads = [&](bool multi) {
    ContextPtr ctx = TensorContext::make();
    Tensor x = Tensor::from(xh, "CPU:0", ctx), w = Tensor::from(wh, "CPU:0", ctx);
    x.requires_grad_();
    w.requires_grad_();
    Tensor xs = multi ? x.shard(d, 0) : x, ws = multi ? w.shard(d, -1) : w;
    Tensor loss = (xs.matmul(ws).tanh() * xs.sum({1}, true)).sum();
    loss.backward();
    LocalRealizer r(runner());
    absl::Status st = realize_all({x.grad(), w.grad()}, r);
    EXPECT_TRUE(st.ok()) << st;
    return std::vector<HostTensor>{x.grad().to_host().value(), w.grad().to_host().value()};
  };
  std::vector<HostTensor> one = grads(false), many = grads(true);
  for (size_t i = 0; i < one.size(); ++i) expect_close(one[i], many[i], Tolerance{1e-12, 1e-12, 0}, cat("grad ", i));
}

INSTANTIATE_TEST_SUITE_P(Devices, TensorMulti, testing::Values(2, 3));

// RealizeOptions::into: the result is written into the destination's storage, so every
// tensor holding it (the destination itself) reads the new values; a destination of
// another shape, or one that is not realized, is refused before anything runs.
TEST(TensorRealize, IntoWritesTheResultInPlace) {
  InterpRealizer r;
  ContextPtr ctx = TensorContext::make();
  Tensor w = Tensor::from(host(Scalar::Float32, {3}, {1, 2, 3}), "CPU:0", ctx);
  Tensor next = w * 2.0;
  RealizeOptions ro;
  ro.into = {w};
  ASSERT_TRUE(realize_all({next}, r, ro).ok());
  EXPECT_EQ(next.to_host()->data, host(Scalar::Float32, {3}, {2, 4, 6}).data);
  EXPECT_EQ(w.to_host()->data, host(Scalar::Float32, {3}, {2, 4, 6}).data);  // the same storage
  Tensor again = next + 1.0;
  ro.into = {next};
  ASSERT_TRUE(realize_all({again}, r, ro).ok());
  EXPECT_EQ(w.to_host()->data, host(Scalar::Float32, {3}, {3, 5, 7}).data);

  Tensor wide = Tensor::from(host(Scalar::Float32, {2}, {1, 2}), "CPU:0", ctx);
  ro.into = {wide};
  absl::Status shape = realize_all({w * 3.0}, r, ro);
  EXPECT_EQ(shape.code(), absl::StatusCode::kInvalidArgument) << shape;
  ro.into = {w * 4.0};
  absl::Status lazy = realize_all({w * 3.0}, r, ro);
  EXPECT_EQ(lazy.code(), absl::StatusCode::kInvalidArgument) << lazy;
  ro.into = {w, w};
  absl::Status count = realize_all({w * 3.0}, r, ro);
  EXPECT_EQ(count.code(), absl::StatusCode::kInvalidArgument) << count;
  EXPECT_EQ(w.to_host()->data, host(Scalar::Float32, {3}, {3, 5, 7}).data);  // nothing refused ran
}

// A training loop in one context: every step's realize makes new leaves, so every node of
// the next step is new. TensorContext::compact() keeps what living tensors reach (a lazy
// tensor made before it too, and the parameters' gradients) and forgets the rest: the
// same steps with a compaction after each give the same losses and parameters, bit for
// bit, as without, while the graph stays the size of one step instead of growing with
// every one. realize_all compacts by itself past kCompactNodes.
TEST(TensorContext, CompactionKeepsWhatLiveTensorsReachAndForgetsTheRest) {
  struct Run {
    std::vector<std::string> losses;
    HostTensor w, lazy;
    size_t nodes_at_5 = 0, nodes_at_end = 0;
  };
  auto train = [](bool compact) {
    InterpRealizer r;
    Run run;
    ContextPtr ctx = TensorContext::make();
    Tensor x = Tensor::from(randn(Scalar::Float32, {8, 3}, 1), "CPU:0", ctx);
    Tensor y = Tensor::from(randn(Scalar::Float32, {8, 2}, 2), "CPU:0", ctx);
    Tensor w = Tensor::from(randn(Scalar::Float32, {3, 2}, 3, -0.5, 0.5), "CPU:0", ctx);
    w.requires_grad_();
    Tensor lazy;
    for (int step = 1; step <= 30; ++step) {
      Tensor loss = (x.matmul(w) - y).square().mean();
      loss.backward();
      Tensor next = (w - w.grad() * 0.1).detach();
      RealizeOptions ro;
      ro.into = {Tensor(), w};
      EXPECT_TRUE(realize_all({loss, next}, r, ro).ok()) << "step " << step;
      auto l = loss.to_host();
      EXPECT_TRUE(l.ok());
      run.losses.push_back(l.ok() ? l->data : std::string());
      next.requires_grad_();
      w = next;
      if (step == 10) lazy = w * 3.0 + 1.0;  // made before the compactions that follow, realized after them
      if (compact) ctx->compact();
      if (step == 5) run.nodes_at_5 = ctx->graph().size();
    }
    run.nodes_at_end = ctx->graph().size();
    run.w = w.to_host().value();
    EXPECT_TRUE(lazy.realize(r).ok());
    run.lazy = lazy.to_host().value();
    return run;
  };
  const Run kept = train(false), compacted = train(true);
  ASSERT_EQ(kept.losses.size(), compacted.losses.size());
  for (size_t i = 0; i < kept.losses.size(); ++i) EXPECT_EQ(kept.losses[i], compacted.losses[i]) << "step " << i + 1;
  EXPECT_EQ(kept.w.data, compacted.w.data);
  EXPECT_EQ(kept.lazy.data, compacted.lazy.data);
  EXPECT_GT(kept.nodes_at_end, 3 * kept.nodes_at_5) << "without compaction the graph grows with the steps";
  EXPECT_LE(compacted.nodes_at_end, compacted.nodes_at_5 + 16) << "compacted, it stays the size of a step";
}

}  // namespace
}  // namespace uop::client
