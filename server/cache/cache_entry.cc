// The authenticated entry format (cache_entry.h).
#include "server/cache/cache_entry.h"

#include <openssl/crypto.h>

#include <cstdint>

#include "compiler/support/strings.h"

namespace uop::cache_entry {
namespace {

constexpr size_t kKeyAt = kMagic.size(), kMacAt = kKeyAt + 32, kLengthAt = kMacAt + 32;

void append_key_bytes(std::string& out, std::string_view hex_key) {
  auto nib = [](char c) { return c <= '9' ? c - '0' : c - 'a' + 10; };
  for (size_t i = 0; i + 1 < hex_key.size(); i += 2)
    out.push_back(static_cast<char>(nib(hex_key[i]) << 4 | nib(hex_key[i + 1])));
}

std::array<uint8_t, 32> mac_of(const ClusterKey& mac_key, std::string_view stored) {
  return mac_key.mac({stored.substr(0, kMacAt), stored.substr(kLengthAt)});
}

}  // namespace

std::string encode(const ClusterKey& mac_key, std::string_view key, std::string_view payload) {
  std::string out;
  out.reserve(kHeaderSize + payload.size());
  out.append(kMagic);
  append_key_bytes(out, key);
  out.append(32, '\0');  // the HMAC, once the rest is in place
  uint64_t n = payload.size();
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
  out.append(payload);
  std::array<uint8_t, 32> mac = mac_of(mac_key, out);
  out.replace(kMacAt, 32, reinterpret_cast<const char*>(mac.data()), mac.size());
  return out;
}

absl::StatusOr<std::string> decode(const ClusterKey& mac_key, std::string_view key,
                                   std::string stored, std::string_view where) {
  auto loss = [&](std::string_view what) {
    return absl::DataLossError(cat("corrupt cache entry ", key, " in ", where, ": ", what));
  };
  if (stored.size() < kHeaderSize)
    return loss(cat("truncated: ", stored.size(), " bytes, header alone is ", kHeaderSize));
  std::string_view view = stored;
  if (view.substr(0, kMagic.size()) != kMagic)
    return loss(cat("bad magic (not a ", kMagic, " entry: another format or version)"));
  std::string want_key;
  append_key_bytes(want_key, key);
  if (view.substr(kKeyAt, 32) != want_key) return loss("header names another key");
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i)
    n |= uint64_t{static_cast<unsigned char>(stored[kLengthAt + i])} << (8 * i);
  if (n != stored.size() - kHeaderSize)
    return loss(
        cat("length mismatch: header says ", n, " bytes, found ", stored.size() - kHeaderSize));
  std::array<uint8_t, 32> mac = mac_of(mac_key, view);
  if (CRYPTO_memcmp(mac.data(), stored.data() + kMacAt, mac.size()) != 0)
    return loss("HMAC mismatch (not written under this server's cache key)");
  stored.erase(0, kHeaderSize);
  return stored;
}

}  // namespace uop::cache_entry
