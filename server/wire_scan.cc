#include "server/wire_scan.h"

#include <climits>
#include <utility>
#include <vector>

#include "compiler/support/strings.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/message.h"
#include "google/protobuf/wire_format.h"
#include "google/protobuf/wire_format_lite.h"

namespace uop::server {
namespace {

namespace gpb = google::protobuf;
using WFL = gpb::internal::WireFormatLite;

// Repeated fields grow by doubling, and on an arena (as the service parses) the arrays
// outgrown stay until the arena goes: all of them together are under 4x the last size.
// A pointer slot of a repeated message or string field: 4 x 8 bytes.
constexpr uint64_t kSlot = 32;
// A std::string object and the heap block behind it, beyond its characters.
constexpr uint64_t kString = 48;
// One element of a repeated scalar field: 4 x (at most) 8 bytes.
constexpr uint64_t kScalar = 32;
// An unknown field kept in the UnknownFieldSet, beyond its wire bytes.
constexpr uint64_t kUnknown = 48;
// A map entry's hash node, beyond the entry message.
constexpr uint64_t kMapNode = 48;

bool is_varint_type(gpb::FieldDescriptor::Type t) {
  switch (t) {
    case gpb::FieldDescriptor::TYPE_INT32: case gpb::FieldDescriptor::TYPE_INT64: case gpb::FieldDescriptor::TYPE_UINT32:
    case gpb::FieldDescriptor::TYPE_UINT64: case gpb::FieldDescriptor::TYPE_SINT32: case gpb::FieldDescriptor::TYPE_SINT64:
    case gpb::FieldDescriptor::TYPE_BOOL: case gpb::FieldDescriptor::TYPE_ENUM:
      return true;
    default:
      return false;
  }
}

class Scanner {
 public:
  Scanner(gpb::io::CodedInputStream& in, const WireScanLimits& limits) : in_(in), limits_(limits) {}

  WireCost cost;

  // Reads fields of `d` up to the current limit (or the end). False: malformed.
  bool message(const gpb::Descriptor& d, int depth) {
    if (depth > limits_.max_depth) {
      error_ = cat("messages nest deeper than ", limits_.max_depth, " levels");
      return false;
    }
    while (!stopped()) {
      const uint32_t tag = in_.ReadTag();
      if (tag == 0) return in_.ConsumedEntireMessage() || fail("a field tag is 0");  // or the end
      const gpb::FieldDescriptor* f = d.FindFieldByNumber(static_cast<int>(WFL::GetTagFieldNumber(tag)));
      const WFL::WireType wire = WFL::GetTagWireType(tag);
      if (!f || !known_field(*f, tag, wire, depth)) {
        if (!error_.empty()) return false;
        if (!unknown(tag)) return false;
      }
    }
    return true;
  }

  const std::string& error() const { return error_; }
  bool stopped() const { return cost.stopped; }

 private:
  // A field of the message's type. False with no error_: the wire type does not match the
  // field's, and protobuf keeps it as an unknown field (nothing has been read yet).
  bool known_field(const gpb::FieldDescriptor& f, uint32_t tag, WFL::WireType wire, int depth) {
    using FD = gpb::FieldDescriptor;
    const bool repeated = f.is_repeated();
    if (f.type() == FD::TYPE_MESSAGE) {
      if (wire != WFL::WIRETYPE_LENGTH_DELIMITED) return false;
      const gpb::Descriptor& sub = *f.message_type();
      add(size_of(sub) + (repeated ? kSlot : 0) + (f.is_map() ? kMapNode : 0));
      ++cost.messages;
      if (&sub == limits_.count) count();
      int len = 0;
      if (!length(&len)) return fail("a message's length is cut off or too large");
      auto limit = in_.PushLimit(len);
      bool ok = message(sub, depth + 1);
      if (ok && !stopped() && in_.BytesUntilLimit() != 0) ok = fail("a message is cut off before its declared length");
      in_.PopLimit(limit);
      return ok;
    }
    if (f.type() == FD::TYPE_STRING || f.type() == FD::TYPE_BYTES) {
      if (wire != WFL::WIRETYPE_LENGTH_DELIMITED) return false;
      int len = 0;
      if (!length(&len) || !in_.Skip(len)) return fail("a string is cut off");
      add(static_cast<uint64_t>(len) + kString + (repeated ? kSlot : 0));
      return true;
    }
    const WFL::WireType natural = gpb::internal::WireFormat::WireTypeForFieldType(f.type());
    if (repeated && wire == WFL::WIRETYPE_LENGTH_DELIMITED && natural != WFL::WIRETYPE_LENGTH_DELIMITED) {
      // Packed scalars: count the elements (their bytes are all read, nothing kept).
      int len = 0;
      if (!length(&len)) return fail("a packed field's length is cut off or too large");
      uint64_t elements = 0;
      if (is_varint_type(f.type())) {
        auto limit = in_.PushLimit(len);
        uint64_t v = 0;
        while (in_.BytesUntilLimit() > 0) {
          if (!in_.ReadVarint64(&v)) {
            in_.PopLimit(limit);
            return fail("a packed field is cut off");
          }
          ++elements;
        }
        in_.PopLimit(limit);
      } else {
        if (!in_.Skip(len)) return fail("a packed field is cut off");
        elements = len / (natural == WFL::WIRETYPE_FIXED32 ? 4 : 8);
      }
      add(elements * kScalar);
      return true;
    }
    if (wire != natural) return false;
    if (!WFL::SkipField(&in_, tag)) return fail("a field is cut off");
    if (repeated) add(kScalar);
    return true;
  }

  // A field the type does not have (or of another wire type): kept as an unknown field.
  bool unknown(uint32_t tag) {
    const int before = in_.CurrentPosition();
    if (!WFL::SkipField(&in_, tag)) return fail("a field is cut off or malformed");
    add(static_cast<uint64_t>(in_.CurrentPosition() - before) + kUnknown);
    return true;
  }

  void add(uint64_t n) {
    cost.bytes += n;
    if (cost.bytes > limits_.max_bytes) cost.stopped = true;
  }
  void count() {
    if (++cost.counted > limits_.max_counted) cost.stopped = true;
  }
  bool fail(std::string what) {
    if (error_.empty()) error_ = std::move(what);
    return false;
  }
  // A length-delimited field's length, when it can fit in what protobuf reads (2 GiB).
  bool length(int* len) {
    uint32_t n = 0;
    if (!in_.ReadVarint32(&n) || n > static_cast<uint32_t>(INT_MAX - in_.CurrentPosition())) return false;
    *len = static_cast<int>(n);
    return true;
  }

  uint64_t size_of(const gpb::Descriptor& d) {
    for (auto& [desc, n] : sizes_)
      if (desc == &d) return n;
    const gpb::Message* proto = gpb::MessageFactory::generated_factory()->GetPrototype(&d);
    uint64_t n = proto ? proto->SpaceUsedLong() : 256;
    sizes_.emplace_back(&d, n);
    return n;
  }

  gpb::io::CodedInputStream& in_;
  const WireScanLimits& limits_;
  std::string error_;
  std::vector<std::pair<const gpb::Descriptor*, uint64_t>> sizes_;  // a handful of types
};

}  // namespace

absl::StatusOr<WireCost> scan_wire(gpb::io::ZeroCopyInputStream& input, const gpb::Descriptor& type,
                                   const WireScanLimits& limits) {
  gpb::io::CodedInputStream in(&input);
  in.SetTotalBytesLimit(INT_MAX);
  Scanner s(in, limits);
  s.cost.bytes = gpb::MessageFactory::generated_factory()->GetPrototype(&type)->SpaceUsedLong();
  if (!s.message(type, 0) && !s.stopped())
    return absl::InvalidArgumentError(cat("the request is not a valid ", type.full_name(), " message: ",
                                          s.error().empty() ? "a malformed field tag" : s.error()));
  return s.cost;
}

}  // namespace uop::server
