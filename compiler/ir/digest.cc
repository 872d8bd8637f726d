#include "compiler/ir/digest.h"

#include <openssl/evp.h>
#include <openssl/sha.h>

#include <memory>

#include <cstring>

#include "absl/container/flat_hash_set.h"

namespace uop {
namespace {

constexpr std::string_view kEncodingVersion = "uop-digest-v1";

class Encoder {
 public:
  explicit Encoder(std::string& out) : out_(out) {}
  void u8(uint8_t v) { out_.push_back(static_cast<char>(v)); }
  void i64(int64_t v) { u64(static_cast<uint64_t>(v)); }
  void u64(uint64_t v) {
    for (int i = 0; i < 8; ++i) out_.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  }
  void str(std::string_view s) { u64(s.size()); out_.append(s); }
  void b(bool v) { u8(v ? 1 : 0); }
  void pairs(const std::vector<std::pair<int64_t, int64_t>>& v) {
    u64(v.size());
    for (auto& [a, c] : v) { i64(a); i64(c); }
  }
  void cv(const ConstValue& c) { u8(static_cast<uint8_t>(c.kind())); u64(c.bits()); }

 private:
  std::string& out_;
};

void encode_arg(Encoder& e, const Arg& arg) {
  e.str(arg_kind_name(arg_kind(arg)));
  struct V {
    Encoder& e;
    void operator()(const NoArg&) {}
    void operator()(const ConstValue& c) { e.cv(c); }
    void operator()(const VConstArg& v) { e.u64(v.values.size()); for (auto& c : v.values) e.cv(c); }
    void operator()(const IntArg& v) { e.i64(v.value); }
    void operator()(const IntsArg& v) { e.u64(v.values.size()); for (auto x : v.values) e.i64(x); }
    void operator()(const BoolsArg& v) { e.u64(v.values.size()); for (bool x : v.values) e.b(x); }
    void operator()(const RangeArg& r) { e.i64(r.axis_id); e.str(axis_type_name(r.type)); e.b(r.renumbered); }
    void operator()(const ReduceAxisArg& r) {
      e.str(reduce_op_name(r.op));
      e.u64(r.axes.size());
      for (auto x : r.axes) e.i64(x);
    }
    void operator()(const ReduceOpArg& r) { e.str(reduce_op_name(r.op)); }
    void operator()(const BufferArg& b) { e.i64(b.size); }
    void operator()(const BufferViewArg& b) { e.i64(b.size); e.i64(b.offset); }
    void operator()(const BufferizeArg& b) { e.str(b.device); e.str(addrspace_name(b.addrspace)); e.b(b.removable); }
    void operator()(const ParamArg& p) { e.i64(p.slot); e.i64(p.size); }
    void operator()(const DefineVarArg& v) { e.str(v.name); e.i64(v.min); e.i64(v.max); }
    void operator()(const DefineRegArg& r) { e.i64(r.size); e.i64(r.id); }
    void operator()(const StrArg& s) { e.str(s.value); }
    void operator()(const BytesArg& s) { e.str(s.value); }
    void operator()(const AxisFactorsArg& a) { e.pairs(a.factors); }
    void operator()(const WmmaArg& w) {
      e.str(w.name); e.i64(w.n); e.i64(w.m); e.i64(w.k);
      e.str(scalar_name(w.dtype_in)); e.str(scalar_name(w.dtype_out)); e.str(w.device);
      e.i64(w.threads); e.pairs(w.upcast_a); e.pairs(w.upcast_b); e.pairs(w.upcast_c);
      e.pairs(w.reduce_axes); e.i64(w.tile_grid_x); e.i64(w.tile_grid_y);
    }
    void operator()(const CallInfoArg& c) {
      e.str(c.name); e.str(c.grad_tag);
      e.u64(c.metadata.size());
      for (auto& m : c.metadata) e.str(m);
      e.b(c.precompile); e.b(c.precompile_backward);
    }
    void operator()(const KernelInfoArg& k) { e.b(k.kernel); e.str(k.name); }
    void operator()(const DeviceArg& d) { e.u64(d.devices.size()); for (auto& s : d.devices) e.str(s); }
    void operator()(const CustomFunctionArg& c) {
      e.str(c.kind == CustomFunctionKind::EncDec ? "EncDec" : "Graph");
      e.str(c.name);
    }
  };
  std::visit(V{e}, arg);
}

}  // namespace

Digest sha256(std::string_view bytes) {
  // The one-shot SHA256() looks the algorithm up (EVP_MD_fetch) on every call, a quarter
  // of the digest's cost over small node encodings: fetch once, keep a context per thread.
  static EVP_MD* const md = EVP_MD_fetch(nullptr, "SHA256", nullptr);
  thread_local std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> ctx(EVP_MD_CTX_new(), &EVP_MD_CTX_free);
  Digest d;
  unsigned int len = 0;
  if (md && ctx && EVP_DigestInit_ex(ctx.get(), md, nullptr) == 1 &&
      EVP_DigestUpdate(ctx.get(), bytes.data(), bytes.size()) == 1 && EVP_DigestFinal_ex(ctx.get(), d.bytes.data(), &len) == 1)
    return d;
  SHA256(reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size(), d.bytes.data());
  return d;
}

std::string canonical_encoding(const UOp* u) {
  std::string out;
  out.reserve(96 + 32 * u->num_src());
  Encoder e(out);
  e.str(kEncodingVersion);
  e.str(op_name(u->op()));
  const DType& dt = u->dtype();
  e.str(scalar_name(dt.scalar));
  e.u64(dt.count);
  e.b(dt.ptr);
  if (dt.ptr) {
    e.str(addrspace_name(dt.addrspace));
    e.i64(dt.size);
  }
  encode_arg(e, u->arg());
  e.u64(u->num_src());
  for (const UOp* s : u->src()) out.append(reinterpret_cast<const char*>(s->digest().bytes.data()), 32);
  return out;
}

void compute_digests(const UOp* root) {
  if (root->has_digest_) return;
  struct Frame { const UOp* u; size_t next; };
  std::vector<Frame> stack{{root, 0}};
  while (!stack.empty()) {
    Frame& f = stack.back();
    if (f.next < f.u->num_src()) {
      const UOp* s = f.u->src(f.next++);
      if (!s->has_digest_) stack.push_back({s, 0});
      continue;
    }
    if (!f.u->has_digest_) {
      f.u->digest_ = sha256(canonical_encoding(f.u));
      f.u->has_digest_ = true;
    }
    stack.pop_back();
  }
}

const Digest& UOp::digest() const {
  if (!has_digest_) compute_digests(this);
  return digest_;
}

std::string Digest::hex() const {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string s(64, '0');
  for (size_t i = 0; i < 32; ++i) {
    s[2 * i] = kHex[bytes[i] >> 4];
    s[2 * i + 1] = kHex[bytes[i] & 15];
  }
  return s;
}

std::optional<Digest> Digest::from_hex(std::string_view hex) {
  if (hex.size() != 64) return std::nullopt;
  Digest d;
  auto nib = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  for (size_t i = 0; i < 32; ++i) {
    int hi = nib(hex[2 * i]), lo = nib(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) return std::nullopt;
    d.bytes[i] = static_cast<uint8_t>(hi * 16 + lo);
  }
  return d;
}

}  // namespace uop
