// What the client decides on its own, without any server: gRPC -> absl status
// conversion, how uploads are cut into chunks, targets and cache-status wording, the
// `uop` argument parser and naming helpers, the LISTENING line, and finding uopd.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "client/cli.h"
#include "client/client.h"
#include "client/embedded_server.h"

namespace uop::client {
namespace {

TEST(StatusFromGrpc, KeepsCodeAndMessage) {
  EXPECT_TRUE(status_from_grpc(0, "").ok());
  EXPECT_TRUE(status_from_grpc(0, "ignored").ok());
  absl::Status s = status_from_grpc(3, "node 5 (ADD): bad [verify.alu]");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "node 5 (ADD): bad [verify.alu]");
  EXPECT_EQ(status_from_grpc(5, "x").code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(status_from_grpc(8, "x").code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(status_from_grpc(4, "x").code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(status_from_grpc(14, "worker cpu0 died").code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(status_from_grpc(16, "x").code(), absl::StatusCode::kUnauthenticated);
}

TEST(StatusFromGrpc, UnknownCodesBecomeUnknown) {
  absl::Status s = status_from_grpc(99, "odd");
  EXPECT_EQ(s.code(), absl::StatusCode::kUnknown);
  EXPECT_EQ(s.message(), "odd");
  EXPECT_EQ(status_from_grpc(-1, "neg").code(), absl::StatusCode::kUnknown);
}

TEST(Chunks, EffectiveSizeIsClamped) {
  EXPECT_EQ(effective_chunk_bytes(0), kDefaultChunkBytes);
  EXPECT_EQ(effective_chunk_bytes(1), 1u);
  EXPECT_EQ(effective_chunk_bytes(1u << 20), 1u << 20);
  EXPECT_EQ(effective_chunk_bytes(64ull << 20), kMaxChunkBytes);
  EXPECT_LT(kMaxChunkBytes, 4u << 20);  // leaves room for the rest of the message
}

TEST(Chunks, CoverTheRangeInOrder) {
  const uint64_t MiB = 1u << 20;
  std::vector<ByteRange> r = chunk_ranges(0, 3 * MiB + 5, MiB);
  ASSERT_EQ(r.size(), 4u);
  EXPECT_EQ(r[0], (ByteRange{0, MiB}));
  EXPECT_EQ(r[1], (ByteRange{MiB, MiB}));
  EXPECT_EQ(r[2], (ByteRange{2 * MiB, MiB}));
  EXPECT_EQ(r[3], (ByteRange{3 * MiB, 5}));
}

TEST(Chunks, ExactMultipleHasNoEmptyTail) {
  std::vector<ByteRange> r = chunk_ranges(100, 2048, 1024);
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0], (ByteRange{100, 1024}));
  EXPECT_EQ(r[1], (ByteRange{1124, 1024}));
}

TEST(Chunks, EmptyUploadIsOneEmptyChunk) {
  std::vector<ByteRange> r = chunk_ranges(7, 0, 1024);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0], (ByteRange{7, 0}));
}

TEST(Chunks, SmallerThanAChunkIsOneChunk) {
  std::vector<ByteRange> r = chunk_ranges(0, 10, 0);  // 0: the default 1 MiB
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0], (ByteRange{0, 10}));
}

TEST(Chunks, OversizedRequestIsCutAtTheMaximum) {
  std::vector<ByteRange> r = chunk_ranges(0, 2ull * kMaxChunkBytes + 1, 1ull << 30);
  ASSERT_EQ(r.size(), 3u);
  EXPECT_EQ(r[0].length, kMaxChunkBytes);
  EXPECT_EQ(r[2], (ByteRange{2ull * kMaxChunkBytes, 1}));
}

TEST(Target, Parses) {
  auto cpu = parse_target("cpu");
  ASSERT_TRUE(cpu.ok());
  EXPECT_EQ(cpu->backend, "cpu");
  EXPECT_EQ(cpu->arch, "");
  auto sm90 = parse_target("cuda:sm_90");
  ASSERT_TRUE(sm90.ok());
  EXPECT_EQ(sm90->backend, "cuda");
  EXPECT_EQ(sm90->arch, "sm_90");
  EXPECT_TRUE(parse_target("cuda").ok());
  for (const char* bad : {"", "gpu", "cuda:", "cuda:sm_", "cuda:90", "cuda:sm_9x", "cpu:znver4", "CPU"}) {
    auto t = parse_target(bad);
    EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_EQ(target_str(*sm90), "cuda:sm_90");
  EXPECT_EQ(target_str(Target{}), "cpu");
}

TEST(CacheStatus, ReadsLikeAPerson) {
  Kernel k;
  k.status = CacheStatus::Miss;
  k.compile_ms = 12.3;
  EXPECT_EQ(describe_cache(k), "miss, compiled in 12 ms");
  k.compile_ms = 0.42;
  EXPECT_EQ(describe_cache(k), "miss, compiled in 0.4 ms");
  k.status = CacheStatus::Hit;
  k.tier = "memory";
  EXPECT_EQ(describe_cache(k), "hit (memory)");
  k.status = CacheStatus::Coalesced;
  EXPECT_EQ(describe_cache(k).rfind("coalesced", 0), 0u);
  EXPECT_EQ(cache_status_name(CacheStatus::Hit), "hit");
  EXPECT_EQ(cache_status_name(CacheStatus::Miss), "miss");
}

TEST(ListeningLine, Parses) {
  EXPECT_EQ(parse_listening_line("LISTENING 127.0.0.1:4242"), "127.0.0.1:4242");
  EXPECT_EQ(parse_listening_line("LISTENING 127.0.0.1:4242\r"), "127.0.0.1:4242");
  EXPECT_EQ(parse_listening_line("LISTENING [::1]:80"), "[::1]:80");
  EXPECT_EQ(parse_listening_line("LISTENING localhost"), std::nullopt);
  EXPECT_EQ(parse_listening_line("LISTENING 127.0.0.1:"), std::nullopt);
  EXPECT_EQ(parse_listening_line("LISTENING 127.0.0.1:port"), std::nullopt);
  EXPECT_EQ(parse_listening_line("listening 127.0.0.1:1"), std::nullopt);
  EXPECT_EQ(parse_listening_line("INFO: LISTENING 127.0.0.1:1"), std::nullopt);
  EXPECT_EQ(parse_listening_line(""), std::nullopt);
}

class FindUopd : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/uop-find-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    std::filesystem::create_directories(dir_ + "/build/client");
    std::filesystem::create_directories(dir_ + "/build/server");
    std::filesystem::create_directories(dir_ + "/bin");
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  void make_exe(const std::string& path) {
    std::ofstream(path) << "#!/bin/sh\n";
    chmod(path.c_str(), 0755);
  }
  std::string dir_;
};

TEST_F(FindUopd, FlagWins) {
  make_exe(dir_ + "/bin/my-uopd");
  make_exe(dir_ + "/build/server/uopd");
  auto p = find_uopd(dir_ + "/bin/my-uopd", dir_ + "/build/client/uop", "");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(*p, dir_ + "/bin/my-uopd");
  EXPECT_EQ(find_uopd(dir_ + "/bin/nope", dir_ + "/build/client/uop", "").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(FindUopd, BuildTreeBeforePath) {
  make_exe(dir_ + "/build/server/uopd");
  make_exe(dir_ + "/bin/uopd");
  std::string path = dir_ + "/bin";
  auto p = find_uopd("", dir_ + "/build/client/uop", path.c_str());
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(*p, dir_ + "/build/server/uopd");
}

TEST_F(FindUopd, ThenPath) {
  make_exe(dir_ + "/bin/uopd");
  std::string path = "/nonexistent:" + dir_ + "/bin";
  auto p = find_uopd("", dir_ + "/build/client/uop", path.c_str());
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(*p, dir_ + "/bin/uopd");
}

TEST_F(FindUopd, NotFoundSaysWhereItLooked) {
  std::ofstream(dir_ + "/bin/uopd") << "not executable";
  std::string path = dir_ + "/bin";
  auto p = find_uopd("", dir_ + "/build/client/uop", path.c_str());
  EXPECT_EQ(p.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(p.status().message().find(dir_ + "/build/server/uopd"), absl::string_view::npos) << p.status();
  EXPECT_NE(p.status().message().find("--uopd"), absl::string_view::npos) << p.status();
}

}  // namespace
}  // namespace uop::client

namespace uop::cli {
namespace {

absl::StatusOr<Args> parse(std::vector<std::string> v) {
  static const flags::Tool t = uop_flags(/*onnx=*/true);
  return t.parse(v);
}

TEST(ParseArgs, CommandPositionalAndOptions) {
  auto a = parse({"--embedded", "run", "g.json", "--in", "x=a.npy", "--in=y=b.npy", "--random", "3"});
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->command, "run");
  EXPECT_EQ(a->positional, std::vector<std::string>{"g.json"});
  EXPECT_EQ(a->all("in"), (std::vector<std::string>{"x=a.npy", "y=b.npy"}));
  EXPECT_TRUE(a->on("embedded"));
  EXPECT_EQ(a->get("random"), "3");
  EXPECT_EQ(a->get("server"), "");
  auto cases = parse({"onnx-test", "a", "b", "--shard", "0/2", "--interp"});
  ASSERT_TRUE(cases.ok()) << cases.status();
  EXPECT_EQ(cases->positional.size(), 2u);
  EXPECT_TRUE(cases->on("interp"));
}

TEST(ParseArgs, UsageErrors) {
  EXPECT_EQ(parse({"run", "--bogus"}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(parse({"run", "-x"}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(parse({"run", "g.json", "--in"}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(parse({"stats", "--embedded=yes"}).status().code(), absl::StatusCode::kInvalidArgument);
  // An option of another command is refused, naming it and the command (stats once took
  // --in and ignored it).
  EXPECT_EQ(parse({"stats", "--in", "x=y.npy"}).status().message(), "--in is not an option of 'uop stats'");
  EXPECT_EQ(parse({"compile", "g.json", "--stage=render"}).status().message(), "--stage is not an option of 'uop compile'");
  EXPECT_EQ(parse({"explain", "g.json", "--binary-out=d"}).status().message(),
            "--binary-out is not an option of 'uop explain'");
  EXPECT_EQ(parse({"stats", "g.json"}).status().message(), "unexpected argument 'g.json' for 'uop stats'");
  EXPECT_EQ(parse({"run"}).status().message(), "'uop run' needs GRAPH");
  auto h = parse({"-h"});
  ASSERT_TRUE(h.ok());
  EXPECT_TRUE(h->help);
}

TEST(ParseArgs, HelpNamesNoOtherProgram) {
  // A client-only install has no uopc to point at.
  std::string help = uop_flags(true).help();
  EXPECT_EQ(help.find("uopc help"), std::string::npos) << help;
  EXPECT_NE(help.find("explain GRAPH"), std::string::npos) << help;
  EXPECT_NE(help.find("onnx-test CASE_DIR..."), std::string::npos) << help;
  EXPECT_EQ(uop_flags(false).help().find("onnx-test"), std::string::npos);
}

TEST(ParseArgs, ClientOptions) {
  auto a = parse({"stats", "--deadline=2.5", "--tls-ca=ca.pem", "--token=t1"});
  ASSERT_TRUE(a.ok()) << a.status();
  auto o = client_options(*a, "env-token");
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->deadline, absl::Milliseconds(2500));
  EXPECT_EQ(o->bearer_token, "t1");
  EXPECT_EQ(o->tls_ca, "ca.pem");
  EXPECT_FALSE(o->tls);
  auto bare = parse({"stats", "--tls"});
  ASSERT_TRUE(bare.ok());
  auto env = client_options(*bare, "env-token");
  ASSERT_TRUE(env.ok());
  EXPECT_EQ(env->bearer_token, "env-token");
  EXPECT_TRUE(env->tls);
  EXPECT_EQ(env->deadline, client::ClientOptions().deadline);
  auto zero = parse({"stats", "--deadline=0"});
  ASSERT_TRUE(zero.ok());
  EXPECT_FALSE(client_options(*zero, nullptr).ok());
}

TEST(ParseArgs, NameFilePairs) {
  auto a = parse({"run", "g", "--in", "x=a.npy", "--out", "y=dir/b=c.npy"});
  ASSERT_TRUE(a.ok());
  auto ins = name_file_pairs(*a, "in");
  ASSERT_TRUE(ins.ok());
  EXPECT_EQ(*ins, (std::vector<std::pair<std::string, std::string>>{{"x", "a.npy"}}));
  auto outs = name_file_pairs(*a, "out");
  ASSERT_TRUE(outs.ok());
  EXPECT_EQ((*outs)[0].second, "dir/b=c.npy");  // the first '=' splits
  for (const char* bad : {"x", "=a.npy", "x="}) {
    auto b = parse({"run", "g", "--in", bad});
    ASSERT_TRUE(b.ok());
    EXPECT_FALSE(name_file_pairs(*b, "in").ok()) << bad;
  }
}

// `uop run --profile`'s table: a header and one row per kernel in the order given, the
// numbers right-aligned, a rate without an estimate shown as "-"; the flag parses.
TEST(ProfileTable, OneRowPerKernelInOrder) {
  std::vector<client::KernelProfile> p = {
      {"r_64_64_64", "d1", "CPU:0", 2, 3.5, 1.75, 1e9, 2e9, 285.71, 571.43, "Thread(64) Loop(16) Reduce(64) lanes=4"},
      {"E_4096", "d2", "CPU:0", 1, 0.01, 0.01, 0, 0, 0, 0, ""},
  };
  std::string table = profile_table(p);
  std::vector<std::string> lines;
  for (size_t at = 0, nl; (nl = table.find('\n', at)) != std::string::npos; at = nl + 1) lines.push_back(table.substr(at, nl - at));
  ASSERT_EQ(lines.size(), 3u) << table;
  EXPECT_TRUE(lines[0].starts_with("kernel")) << lines[0];
  EXPECT_NE(lines[0].find("GFLOPS"), std::string::npos);
  EXPECT_NE(lines[0].find("GB/s"), std::string::npos);
  EXPECT_TRUE(lines[1].starts_with("r_64_64_64 ")) << lines[1];
  EXPECT_NE(lines[1].find("3.500"), std::string::npos) << lines[1];
  EXPECT_NE(lines[1].find("285.71"), std::string::npos) << lines[1];
  EXPECT_TRUE(lines[1].ends_with("Thread(64) Loop(16) Reduce(64) lanes=4")) << lines[1];
  EXPECT_TRUE(lines[2].starts_with("E_4096 ")) << lines[2];
  EXPECT_NE(lines[2].find(" - "), std::string::npos) << lines[2];
  // Columns line up: "launches" ends where each row's launch count does.
  const size_t launches_end = lines[0].find("launches") + std::string("launches").size();
  EXPECT_EQ(lines[1][launches_end - 1], '2') << table;
  EXPECT_EQ(lines[2][launches_end - 1], '1') << table;
  auto a = parse({"run", "g", "--profile"});
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_TRUE(a->has("profile"));
}

TEST(ParseArgs, Numbers) {
  EXPECT_EQ(*parse_seed("42"), 42u);
  EXPECT_EQ(*parse_seed("18446744073709551615"), UINT64_MAX);
  for (const char* bad : {"", "-1", "x", "1.5", "18446744073709551616"}) EXPECT_FALSE(parse_seed(bad).ok()) << bad;
  EXPECT_EQ(*parse_seconds("0.5"), absl::Milliseconds(500));
  EXPECT_EQ(*parse_seconds("60"), absl::Seconds(60));
  for (const char* bad : {"", "0", "-3", "soon", "nan", "inf"}) EXPECT_FALSE(parse_seconds(bad).ok()) << bad;
}

TEST(ServerAddress, FlagThenEnvThenDefault) {
  auto with_flag = parse({"stats", "--server=h:1"});
  auto bare = parse({"stats"});
  ASSERT_TRUE(with_flag.ok() && bare.ok());
  EXPECT_EQ(server_address(*with_flag, "e:2"), "h:1");
  EXPECT_EQ(server_address(*bare, "e:2"), "e:2");
  EXPECT_EQ(server_address(*bare, ""), client::kDefaultAddress);
  EXPECT_EQ(server_address(*bare, nullptr), "127.0.0.1:7070");
}

TEST(FileNames, AreSafe) {
  EXPECT_EQ(file_name_for("E_12_4n1"), "E_12_4n1");
  EXPECT_EQ(file_name_for("r_3/../x y"), "r_3_.._x_y");
  EXPECT_EQ(file_name_for(""), "kernel");
  EXPECT_EQ(file_name_for(".."), "kernel..");
  EXPECT_EQ(binary_extension(client::Target{"cuda", "sm_90"}), ".cubin");
  EXPECT_EQ(binary_extension(client::Target{"cpu", ""}), ".o");
  EXPECT_EQ(source_extension(client::Target{"cuda", ""}), ".cu");
  EXPECT_EQ(source_extension(client::Target{}), ".ll");
}

}  // namespace
}  // namespace uop::cli
