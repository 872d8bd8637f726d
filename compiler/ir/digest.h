// The structural digest: SHA-256 over a canonical, versioned encoding of a node (op name,
// dtype, arg) and its sources' digests, so it is stable across processes, machines and
// builds. Names are encoded as text, never as enum numbers, so reordering an enum does not
// change any digest. Changing this encoding changes every cache key: the golden digests in
// tests/unit/compiler/ir/digest_test.cc pin it.
#pragma once

#include <string>

#include "compiler/ir/uop.h"

namespace uop {

// The canonical bytes hashed for one node, given its sources' digests are known.
std::string canonical_encoding(const UOp* u);
// SHA-256 of arbitrary bytes (OpenSSL libcrypto).
Digest sha256(std::string_view bytes);

}  // namespace uop
