// Host tensors and their .npy files: value <-> byte conversions, random contents, the
// tolerance comparison, and the .npy reader / writer against files NumPy itself wrote and
// against a catalogue of malformed files.
#include "compiler/interp/npy.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <limits>

#include "compiler/interp/host_tensor.h"
#include "compiler/support/strings.h"

namespace uop {
namespace {

constexpr Scalar kAllDtypes[] = {Scalar::Bool,   Scalar::Int8,    Scalar::Int16,    Scalar::Int32,
                                 Scalar::Int64,  Scalar::UInt8,   Scalar::UInt16,   Scalar::UInt32,
                                 Scalar::UInt64, Scalar::Float16, Scalar::BFloat16, Scalar::Float32,
                                 Scalar::Float64};

std::string unhex(std::string_view hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) out.push_back(static_cast<char>(std::stoi(std::string(hex.substr(i, 2)), nullptr, 16)));
  return out;
}

std::string temp_path(std::string_view name) {
  return cat(::testing::TempDir(), "/uop_npy_test_", getpid(), "_", name);
}

// ---------------------------------------------------------------------------------------
// HostTensor

TEST(HostTensor, BytesAreWhatCompiledCodeSees) {
  HostTensor h = HostTensor::of(Scalar::Float16, {2}, {1.0, -2.0});
  EXPECT_EQ(h.data, std::string("\x00\x3c\x00\xc0", 4));
  HostTensor b = HostTensor::of(Scalar::BFloat16, {1}, {1.0});
  EXPECT_EQ(b.data, std::string("\x80\x3f", 2));
  HostTensor t = HostTensor::of(Scalar::Bool, {3}, {1.0, 0.0, 5.0});
  EXPECT_EQ(t.data, std::string("\x01\x00\x01", 3));
  HostTensor i = HostTensor::zeros(Scalar::Int16, {2});
  i.set(0, ConstValue::Int(-2));
  i.set(1, ConstValue::Int(70000));  // wraps like a CAST
  EXPECT_EQ(i.data, std::string("\xfe\xff\x70\x11", 4));
  EXPECT_EQ(i.get(0), ConstValue::Int(-2));
  HostTensor f = HostTensor::zeros(Scalar::Float32, {});
  f.set(0, ConstValue::Int(3));  // another kind converts
  EXPECT_EQ(f.get(0), ConstValue::Float(3.0));
  f.set(0, ConstValue::Float(0.1));  // rounded to float32
  EXPECT_EQ(f.get(0).as_float(), static_cast<double>(0.1f));
  EXPECT_EQ(f.numel(), 1);
  EXPECT_EQ(HostTensor::zeros(Scalar::Int64, {3, 0, 2}).numel(), 0);
}

TEST(HostTensor, CheckedNumelRefusesOverflowAndNegatives) {
  EXPECT_EQ(checked_numel(std::vector<int64_t>{}), 1);
  EXPECT_EQ(checked_numel(std::vector<int64_t>{2, 3}), 6);
  EXPECT_EQ(checked_numel(std::vector<int64_t>{0, 5}), 0);
  EXPECT_EQ(checked_numel(std::vector<int64_t>{-1, 5}), std::nullopt);
  EXPECT_EQ(checked_numel(std::vector<int64_t>{int64_t{1} << 32, int64_t{1} << 32}), std::nullopt);
}

TEST(HostTensor, RandomIsDeterministicAndInRange) {
  for (Scalar s : kAllDtypes) {
    HostTensor a = HostTensor::random(s, {64}, 42), b = HostTensor::random(s, {64}, 42);
    EXPECT_EQ(a, b) << scalar_name(s);
    EXPECT_NE(a, HostTensor::random(s, {64}, 43)) << scalar_name(s);
    for (ConstValue v : a.values()) {
      if (scalar_is_float(s)) {
        EXPECT_TRUE(v.as_float() >= -2 && v.as_float() <= 2) << v.str();
      } else if (s != Scalar::Bool) {
        EXPECT_TRUE(v.to_int() >= -16 && v.to_int() <= 32) << v.str();
      }
    }
  }
  HostTensor bools = HostTensor::random(Scalar::Bool, {1000}, 7);
  int trues = 0;
  for (ConstValue v : bools.values()) trues += v.as_bool();
  EXPECT_GT(trues, 400);
  EXPECT_LT(trues, 600);
}

TEST(HostTensor, CompareIntsExactlyAndReportsFirstAndWorst) {
  HostTensor e = HostTensor::of(Scalar::Int32, {2, 3}, {1, 2, 3, 4, 5, 6});
  EXPECT_TRUE(compare(e, e).ok);
  HostTensor g = e;
  g.set(1, ConstValue::Int(3));
  g.set(5, ConstValue::Int(100));
  CompareResult r = compare(e, g);
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.mismatches, 2);
  EXPECT_EQ(r.first->index, 1);
  EXPECT_EQ(r.worst->index, 5);
  EXPECT_EQ(r.message,
            "int32[2, 3]: 2 of 6 elements differ; first at [0, 1] (flat 1): expected 2, got 3; "
            "worst at [1, 2] (flat 5): expected 6, got 100");
}

TEST(HostTensor, CompareFloatsWithinTolerance) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  HostTensor e = HostTensor::of(Scalar::Float32, {5}, {1.0, nan, INFINITY, 0.0, 1000.0});
  HostTensor g = HostTensor::of(Scalar::Float32, {5}, {1.0000001, nan, INFINITY, -0.0, 1000.001});
  EXPECT_TRUE(compare(e, g).ok) << compare(e, g).message;
  EXPECT_FALSE(compare(e, g, Tolerance::exact()).ok);
  // NaN against a number, and inf against the largest float, always fail.
  HostTensor g2 = g;
  g2.set(0, ConstValue::Float(nan));
  CompareResult r = compare(e, g2);
  EXPECT_EQ(r.mismatches, 1);
  EXPECT_NE(r.message.find("expected 1.0, got nan"), std::string::npos) << r.message;
  HostTensor g3 = g;
  g3.set(2, ConstValue::Float(std::numeric_limits<float>::max()));
  EXPECT_FALSE(compare(e, g3).ok);
  // ULP: 1 and the next float32 up are one ULP apart.
  HostTensor a = HostTensor::of(Scalar::Float32, {1}, {1.0});
  HostTensor b = HostTensor::of(Scalar::Float32, {1}, {std::nextafter(1.0f, 2.0f)});
  EXPECT_TRUE(compare(a, b, Tolerance{0, 0, 1}).ok);
  CompareResult u = compare(a, b, Tolerance::exact());
  EXPECT_EQ(u.first->ulp, 1);
  EXPECT_NE(u.message.find("1 ulp"), std::string::npos) << u.message;
  // float16: 1 vs 1 + 2^-10 is within the default tolerance (one ULP).
  HostTensor h1 = HostTensor::of(Scalar::Float16, {1}, {1.0}), h2 = HostTensor::of(Scalar::Float16, {1}, {1.0009765625});
  EXPECT_TRUE(compare(h1, h2).ok);
  EXPECT_FALSE(compare(h1, HostTensor::of(Scalar::Float16, {1}, {1.01})).ok);
}

TEST(HostTensor, CompareRefusesShapeOrDtypeMismatch) {
  HostTensor a = HostTensor::zeros(Scalar::Float32, {2, 3});
  CompareResult r = compare(a, HostTensor::zeros(Scalar::Float32, {3, 2}));
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.message, "expected float32[2, 3], got float32[3, 2]");
  EXPECT_FALSE(compare(a, HostTensor::zeros(Scalar::Float64, {2, 3})).ok);
}

// ---------------------------------------------------------------------------------------
// .npy

TEST(Npy, RoundTripsEveryDtypeAndShape) {
  const std::vector<std::vector<int64_t>> shapes = {{}, {0}, {1}, {7}, {2, 3}, {2, 0, 4}, {1, 1, 1, 5}, {3, 1, 2, 1}};
  uint64_t seed = 1;
  for (Scalar s : kAllDtypes) {
    for (const auto& shape : shapes) {
      HostTensor t = HostTensor::random(s, shape, seed++);
      std::string bytes = serialize_npy(t);
      // The data starts on a 64-byte boundary after a header ending in '\n', as NumPy writes.
      size_t header_end = bytes.size() - t.data.size();
      EXPECT_EQ(header_end % 64, 0u);
      EXPECT_EQ(bytes[header_end - 1], '\n');
      auto back = parse_npy(bytes);
      ASSERT_TRUE(back.ok()) << back.status();
      EXPECT_EQ(*back, t) << scalar_name(s) << shape_str(shape);
    }
  }
}

TEST(Npy, LargeFileRoundTrip) {
  HostTensor t = HostTensor::random(Scalar::Float32, {1000, 1000}, 9);
  std::string path = temp_path("large.npy");
  ASSERT_TRUE(write_npy(path, t).ok());
  auto back = read_npy(path);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, t);
  std::remove(path.c_str());
}

TEST(Npy, IndexIsWrittenAsInt64) {
  HostTensor t = HostTensor::zeros(Scalar::Index, {2});
  t.set(1, ConstValue::Int(-5));
  auto back = parse_npy(serialize_npy(t));
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->dtype, Scalar::Int64);
  EXPECT_EQ(back->data, t.data);
}

TEST(Npy, BFloat16IsVoidOfTwoBytes) {
  HostTensor t = HostTensor::of(Scalar::BFloat16, {2}, {1.0, -3.5});
  std::string bytes = serialize_npy(t);
  EXPECT_NE(bytes.find("'descr': '<V2'"), std::string::npos);
  std::string alt = bytes;
  alt.replace(alt.find("<V2"), 3, "|V2");
  auto back = parse_npy(alt);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(*back, t);
}

// Files written by NumPy 1.24 (np.save, and numpy.lib.format.write_array for versions 2.0
// and 3.0), byte for byte.
const char* const k_f4_2x3 =
    "934e554d5059010076007b276465736372273a20273c6634272c2027666f727472616e5f6f72646572273a2046616c73"
    "652c20277368617065273a2028322c2033292c207d202020202020202020202020202020202020202020202020202020"
    "202020202020202020202020202020202020202020202020202020202020200a000080bf000000bf000000000000003f"
    "0000803f0000c03f";
const char* const k_i2_scalar =
    "934e554d5059010076007b276465736372273a20273c6932272c2027666f727472616e5f6f72646572273a2046616c73"
    "652c20277368617065273a2028292c207d20202020202020202020202020202020202020202020202020202020202020"
    "202020202020202020202020202020202020202020202020202020202020200af9ff";
const char* const k_b1_4 =
    "934e554d5059010076007b276465736372273a20277c6231272c2027666f727472616e5f6f72646572273a2046616c73"
    "652c20277368617065273a2028342c292c207d2020202020202020202020202020202020202020202020202020202020"
    "202020202020202020202020202020202020202020202020202020202020200a01000001";
const char* const k_u8_empty =
    "934e554d5059010076007b276465736372273a20273c7538272c2027666f727472616e5f6f72646572273a2046616c73"
    "652c20277368617065273a2028302c2033292c207d202020202020202020202020202020202020202020202020202020"
    "202020202020202020202020202020202020202020202020202020202020200a";
const char* const k_f2_3 =
    "934e554d5059010076007b276465736372273a20273c6632272c2027666f727472616e5f6f72646572273a2046616c73"
    "652c20277368617065273a2028332c292c207d2020202020202020202020202020202020202020202020202020202020"
    "202020202020202020202020202020202020202020202020202020202020200a003c00c1007c";
const char* const k_i1_2x2 =
    "934e554d5059010076007b276465736372273a20277c6931272c2027666f727472616e5f6f72646572273a2046616c73"
    "652c20277368617065273a2028322c2032292c207d202020202020202020202020202020202020202020202020202020"
    "202020202020202020202020202020202020202020202020202020202020200a807f0001";
const char* const k_i4_v2 =
    "934e554d50590200740000007b276465736372273a20273c6934272c2027666f727472616e5f6f72646572273a204661"
    "6c73652c20277368617065273a2028332c292c207d202020202020202020202020202020202020202020202020202020"
    "202020202020202020202020202020202020202020202020202020202020200a010000000200000003000000";
const char* const k_i4_v3 =
    "934e554d50590300740000007b276465736372273a20273c6934272c2027666f727472616e5f6f72646572273a204661"
    "6c73652c20277368617065273a2028332c292c207d202020202020202020202020202020202020202020202020202020"
    "202020202020202020202020202020202020202020202020202020202020200a010000000200000003000000";
const char* const k_f8_1x1x2 =
    "934e554d5059010076007b276465736372273a20273c6638272c2027666f727472616e5f6f72646572273a2046616c73"
    "652c20277368617065273a2028312c20312c2032292c207d202020202020202020202020202020202020202020202020"
    "202020202020202020202020202020202020202020202020202020202020200a9a9999999999b93f9c7500883ce437fe";
const char* const k_u2_2 =
    "934e554d5059010076007b276465736372273a20273c7532272c2027666f727472616e5f6f72646572273a2046616c73"
    "652c20277368617065273a2028322c292c207d2020202020202020202020202020202020202020202020202020202020"
    "202020202020202020202020202020202020202020202020202020202020200affff0100";

struct Fixture {
  const char* name;
  const char* hex;
  HostTensor expected;
  bool byte_identical;  // serialize_npy writes exactly these bytes (version 1.0 files)
};

TEST(Npy, ReadsWhatNumPyWrites) {
  HostTensor i2 = HostTensor::zeros(Scalar::Int16, {});
  i2.set(0, ConstValue::Int(-7));
  HostTensor b1 = HostTensor::of(Scalar::Bool, {4}, {1, 0, 0, 1});
  HostTensor i1 = HostTensor::of(Scalar::Int8, {2, 2}, {-128, 127, 0, 1});
  HostTensor u2 = HostTensor::of(Scalar::UInt16, {2}, {65535, 1});
  const Fixture fixtures[] = {
      {"f4_2x3", k_f4_2x3, HostTensor::of(Scalar::Float32, {2, 3}, {-1, -0.5, 0, 0.5, 1, 1.5}), true},
      {"i2_scalar", k_i2_scalar, i2, true},
      {"b1_4", k_b1_4, b1, true},
      {"u8_empty", k_u8_empty, HostTensor::zeros(Scalar::UInt64, {0, 3}), true},
      {"f2_3", k_f2_3, HostTensor::of(Scalar::Float16, {3}, {1.0, -2.5, INFINITY}), true},
      {"i1_2x2", k_i1_2x2, i1, true},
      {"i4_v2", k_i4_v2, HostTensor::of(Scalar::Int32, {3}, {1, 2, 3}), false},
      {"i4_v3", k_i4_v3, HostTensor::of(Scalar::Int32, {3}, {1, 2, 3}), false},
      {"f8_1x1x2", k_f8_1x1x2, HostTensor::of(Scalar::Float64, {1, 1, 2}, {0.1, -1e300}), true},
      {"u2_2", k_u2_2, u2, true},
  };
  for (const Fixture& f : fixtures) {
    std::string bytes = unhex(f.hex);
    auto t = parse_npy(bytes, f.name);
    ASSERT_TRUE(t.ok()) << t.status();
    EXPECT_EQ(*t, f.expected) << f.name << ": " << t->str();
    if (f.byte_identical) {
      EXPECT_EQ(serialize_npy(*t), bytes) << f.name;
    }
  }
}

// A .npy file with this header dict (padded as NumPy pads) and data.
std::string npy(std::string_view dict, std::string_view data, int major = 1) {
  std::string h(dict);
  size_t pre = major == 1 ? 10 : 12;
  size_t total = (pre + h.size() + 1 + 63) / 64 * 64;
  h.append(total - pre - h.size() - 1, ' ');
  h.push_back('\n');
  std::string out("\x93NUMPY", 6);
  out.push_back(static_cast<char>(major));
  out.push_back('\0');
  for (size_t i = 0; i < pre - 8; ++i) out.push_back(static_cast<char>((h.size() >> (8 * i)) & 0xff));
  return out + h + std::string(data);
}

std::string dict(std::string_view descr, std::string_view shape, std::string_view fortran = "False") {
  return cat("{'descr': '", descr, "', 'fortran_order': ", fortran, ", 'shape': ", shape, ", }");
}

TEST(Npy, AcceptsWhatPythonAllows) {
  // Key order, double quotes, no trailing comma, extra spaces, Python 2 longs.
  auto t = parse_npy(npy("{ \"shape\" : (2L,) ,'fortran_order':False,'descr':'<i2'}", std::string(4, '\x01')));
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->shape, std::vector<int64_t>{2});
  // Fortran order is the same bytes for rank <= 1.
  EXPECT_TRUE(parse_npy(npy(dict("<f4", "(1,)", "True"), std::string(4, '\0'))).ok());
  EXPECT_TRUE(parse_npy(npy(dict("<f4", "()", "True"), std::string(4, '\0'))).ok());
  // A one-byte type in big-endian spelling has no byte order to get wrong.
  EXPECT_TRUE(parse_npy(npy(dict(">u1", "(1,)"), std::string(1, '\0'))).ok());
}

TEST(Npy, RefusesMalformedFilesWithAClearError) {
  const std::string f4 = std::string(4, '\0');
  std::string huge_len("\x93NUMPY\x02\x00\x00\x00\x00\x80", 12);
  std::string rank65 = "(";
  for (int i = 0; i < 65; ++i) rank65 += "1, ";
  rank65 += ")";
  struct Case {
    const char* what;
    std::string bytes;
    const char* error;
  } cases[] = {
      {"empty", "", "empty file"},
      {"bad magic", "\x93NUMPX\x01\x00\x10\x00", "magic string"},
      {"text file", "hello, world", "magic string"},
      {"short preamble", "\x93NUMPY\x01", "shorter than a .npy preamble"},
      {"version 4.0", npy(dict("<f4", "(1,)"), f4).replace(6, 1, "\x04"), "format version 4.0"},
      {"version 1.1", npy(dict("<f4", "(1,)"), f4).replace(7, 1, "\x01"), "format version 1.1"},
      {"header past the end", npy(dict("<f4", "(1,)"), "").substr(0, 40), "is cut off"},
      {"header too long", huge_len, "over the limit"},
      {"not a dict", npy("[1, 2]", ""), "not a dict literal"},
      {"missing shape", npy("{'descr': '<f4', 'fortran_order': False}", f4), "lacks the key 'shape'"},
      {"extra key", npy("{'descr': '<f4', 'fortran_order': False, 'shape': (), 'x': 1}", f4), "unexpected header key 'x'"},
      {"duplicate key", npy("{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': ()}", f4), "appears twice"},
      {"structured dtype", npy("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': ()}", f4), "a string, True, False"},
      {"complex dtype", npy(dict("<c8", "(1,)"), std::string(8, '\0')), "unsupported dtype '<c8'"},
      {"object dtype", npy(dict("|O", "(1,)"), std::string(8, '\0')), "unsupported dtype '|O'"},
      {"big-endian", npy(dict(">f4", "(1,)"), f4), "big-endian data ('>f4')"},
      {"fortran order", npy(dict("<f4", "(1, 1)", "True"), f4), "Fortran-order"},
      {"fortran_order not a bool", npy(dict("<f4", "(1,)", "'no'"), f4), "'fortran_order' is a string"},
      {"shape an int", npy(dict("<f4", "(1)"), f4), "'shape' is an int, not a tuple"},
      {"shape a list", npy(dict("<f4", "[1]"), f4), "a string, True, False or a tuple"},
      {"negative dim", npy(dict("<f4", "(-1,)"), f4), "non-negative integer expected"},
      {"dim over int64", npy(dict("<f4", "(99999999999999999999,)"), f4), "does not fit in int64"},
      {"numel overflow", npy(dict("<f4", "(4294967296, 4294967296)"), f4), "more elements than fit"},
      {"bytes overflow", npy(dict("<f8", "(2305843009213693952,)"), f4), "more elements than fit"},
      {"rank over 64", npy(dict("<f4", rank65), f4), "more than 64 dims"},
      {"data too short", npy(dict("<f4", "(2, 3)"), std::string(20, '\0')), "the header says float32[2, 3] = 24 bytes of data, the file has 20"},
      {"data too long", npy(dict("<f4", "(1,)"), std::string(5, '\0')), "1 unexpected bytes after the 4 bytes"},
      {"bool not 0/1", npy(dict("|b1", "(2,)"), "\x01\x02"), "bool element 1 is the byte 2"},
      {"unbalanced quotes", npy("{'descr: '<f4'}", f4), "':' expected after a key"},
      {"text after dict", npy("{'descr': '<f4', 'fortran_order': False, 'shape': ()} x", f4), "text after the closing"},
      {"escape", npy("{'descr': '<f\\4', 'fortran_order': False, 'shape': ()}", f4), "escape or newline"},
  };
  for (const Case& c : cases) {
    auto t = parse_npy(c.bytes, "bad.npy");
    ASSERT_FALSE(t.ok()) << c.what;
    EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument) << c.what;
    std::string msg(t.status().message());
    EXPECT_EQ(msg.rfind("bad.npy: ", 0), 0u) << c.what << ": " << msg;
    EXPECT_NE(msg.find(c.error), std::string::npos) << c.what << ": " << msg;
  }
}

TEST(Npy, MutatedFilesNeverCrash) {
  // Every truncation and many one-byte edits of a valid file: each parse returns a status
  // (under the sanitizer build, without touching memory it should not).
  const std::string good = serialize_npy(HostTensor::random(Scalar::Float16, {3, 2}, 3));
  for (size_t n = 0; n < good.size(); ++n) EXPECT_FALSE(parse_npy(good.substr(0, n)).ok()) << n;
  int ok = 0;
  for (size_t i = 0; i < good.size(); ++i)
    for (char c : std::string("\x00\xff(),'1 }:L-9\n[", 15)) {
      std::string bad = good;
      bad[i] = c;
      ok += parse_npy(bad).ok();
    }
  EXPECT_GT(ok, 0);  // e.g. edits inside the data or the padding
}

TEST(Npy, FileErrorsNameThePath) {
  std::string missing = temp_path("does_not_exist.npy");
  auto t = read_npy(missing);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(std::string(t.status().message()).find(missing), std::string::npos);
  absl::Status st = write_npy(temp_path("no_such_dir/x.npy"), HostTensor::zeros(Scalar::Int8, {1}));
  EXPECT_FALSE(st.ok());
  // The reader checks the header against the file's size before allocating.
  std::string path = temp_path("short.npy");
  std::string bytes = npy(dict("<f8", "(1000000000000,)"), std::string(8, '\0'));
  FILE* f = std::fopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  std::fwrite(bytes.data(), 1, bytes.size(), f);
  std::fclose(f);
  t = read_npy(path);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(std::string(t.status().message()).find("truncated"), std::string::npos) << t.status();
  std::remove(path.c_str());
}

}  // namespace
}  // namespace uop
