#include "compiler/ir/dtype.h"

#include <gtest/gtest.h>

namespace uop {
namespace {

TEST(DType, NamesRoundTrip) {
  for (int i = 0; i < kNumScalars; ++i) {
    auto s = static_cast<Scalar>(i);
    EXPECT_EQ(scalar_from_name(scalar_name(s)), s);
  }
  EXPECT_FALSE(scalar_from_name("float8").has_value());
}

TEST(DType, Str) {
  EXPECT_EQ(dtypes::float32.str(), "float32");
  EXPECT_EQ(dtypes::float32.vec(4).str(), "<4 x float32>");
  EXPECT_EQ(dtypes::float32.ptr_to(AddrSpace::Global, 1024).str(), "ptr<float32, global, 1024>");
  EXPECT_EQ(dtypes::void_.str(), "void");
}

TEST(DType, Properties) {
  EXPECT_TRUE(dtypes::bfloat16.is_float());
  EXPECT_TRUE(dtypes::index.is_signed());
  EXPECT_TRUE(dtypes::uint8.is_unsigned());
  EXPECT_FALSE(dtypes::float32.ptr_to().is_float());
  EXPECT_EQ(dtypes::int16.vec(8).bytes(), 16);
  EXPECT_EQ(dtypes::index.itemsize(), 8);
  EXPECT_EQ(dtypes::float32.ptr_to().pointee(), dtypes::float32);
  EXPECT_NE(dtypes::float32.ptr_to(AddrSpace::Local), dtypes::float32.ptr_to(AddrSpace::Global));
}

}  // namespace
}  // namespace uop
