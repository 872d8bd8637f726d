#include "compiler/support/status_macros.h"

#include <memory>
#include <string>

#include <gtest/gtest.h>

namespace uop {
namespace {

absl::StatusOr<int> half(int x) {
  if (x % 2 != 0) return absl::InvalidArgumentError("odd");
  return x / 2;
}

absl::StatusOr<int> quarter(int x) {
  ASSIGN_OR_RETURN(int h, half(x));
  ASSIGN_OR_RETURN(int q, half(h), "second half: ");
  return q;
}

absl::Status check_even(int x) {
  RETURN_IF_ERROR(half(x));
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<int>> boxed(int x) {
  if (x < 0) return absl::OutOfRangeError("negative");
  return std::make_unique<int>(x);
}

absl::StatusOr<int> unbox(int x) {
  std::unique_ptr<int> p;
  ASSIGN_OR_RETURN(p, boxed(x));  // assigns to an existing, move-only variable
  return *p + 1;
}

absl::Status two_steps(int x, int* calls) {
  RETURN_IF_ERROR(check_even(x));
  ++*calls;
  RETURN_IF_ERROR(check_even(x / 2));
  ++*calls;
  return absl::OkStatus();
}

TEST(StatusMacros, AssignOrReturnPassesValuesAndErrorsThrough) {
  EXPECT_EQ(*quarter(8), 2);
  auto first = quarter(3);
  ASSERT_FALSE(first.ok());
  EXPECT_EQ(first.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(first.status().message(), "odd");
  auto second = quarter(6);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().message(), "second half: odd");
}

TEST(StatusMacros, AssignOrReturnMovesIntoAnExistingVariable) {
  EXPECT_EQ(*unbox(4), 5);
  EXPECT_EQ(unbox(-1).status().code(), absl::StatusCode::kOutOfRange);
}

TEST(StatusMacros, ReturnIfErrorStopsAtTheFirstError) {
  int calls = 0;
  EXPECT_TRUE(two_steps(4, &calls).ok());
  EXPECT_EQ(calls, 2);
  calls = 0;
  EXPECT_EQ(two_steps(6, &calls).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(calls, 1);
  calls = 0;
  EXPECT_FALSE(two_steps(5, &calls).ok());
  EXPECT_EQ(calls, 0);
}

}  // namespace
}  // namespace uop
