#include "compiler/support/flags.h"

#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace uop::flags {
namespace {

// A tool without commands, like uopd.
Tool server_tool() {
  Tool t("srv", "srv: a server.", "Exit status: 0 ok.");
  Command& c = t.common();
  c.string("listen", "HOST:PORT", "where to listen", "127.0.0.1:7070");
  c.string("cache-dir", "DIR", "the cache; empty: none").shown_default("$XDG_CACHE_HOME/srv");
  c.integer("workers", "N", "workers", 2);
  c.integer("threads", "N", "threads").range(0, 4096);
  c.flag("tls", "speak TLS");
  c.choice("lane", {"shm", "grpc"}, "the lane", "shm");
  c.integer("embedded", "PID", "the parent").range(1, INT32_MAX).value_optional();
  return t;
}

// A tool with commands, like uop.
Tool client_tool() {
  Tool t("cli", "cli: a client.");
  t.common().string("server", "HOST:PORT", "the server");
  t.common().flag("embedded", "a private server");
  Command& run = t.command("run", "run a graph").positional("GRAPH");
  run.string("in", "NAME=FILE", "an input").repeatable();
  run.string("o", "OUT", "write here");
  t.command("stats", "the counters");
  t.command("convert", "re-encode").positional("GRAPH").positional("OUT");
  t.command("test", "run cases").rest("CASE_DIR");
  return t;
}

std::string error_of(const Tool& t, std::vector<std::string> argv) {
  auto a = t.parse(argv);
  EXPECT_FALSE(a.ok()) << "accepted";
  if (a.ok()) return "";
  EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(a.status().message());
}

TEST(Flags, ValueAfterEqualsOrAsTheNextArgument) {
  Tool t = server_tool();
  for (const auto& argv : std::vector<std::vector<std::string>>{{"--listen=0.0.0.0:7070"}, {"--listen", "0.0.0.0:7070"}}) {
    auto a = t.parse(argv);
    ASSERT_TRUE(a.ok()) << a.status();
    EXPECT_TRUE(a->has("listen"));
    EXPECT_EQ(a->get("listen"), "0.0.0.0:7070");
  }
  auto empty = t.parse({"--cache-dir="});
  ASSERT_TRUE(empty.ok());
  EXPECT_TRUE(empty->has("cache-dir"));
  EXPECT_EQ(empty->get("cache-dir"), "");
  // A next argument that is an option is not a value: the mistake is named.
  EXPECT_EQ(error_of(t, {"--listen", "--tls"}), "--listen needs a value (--listen=HOST:PORT)");
  EXPECT_EQ(error_of(t, {"--listen"}), "--listen needs a value (--listen=HOST:PORT)");
}

TEST(Flags, DefaultsAndTheLastValueWins) {
  Tool t = server_tool();
  auto a = t.parse({"--workers=3", "--workers", "5"});
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->integer("workers"), 5);
  EXPECT_FALSE(a->has("listen"));
  EXPECT_EQ(a->get("listen"), "127.0.0.1:7070");
  EXPECT_EQ(a->get("lane"), "shm");
  EXPECT_EQ(a->get("cache-dir"), "");  // a computed default is the program's to compute
  EXPECT_FALSE(a->has("threads"));
  EXPECT_EQ(a->integer("threads"), 0);
}

TEST(Flags, Booleans) {
  Tool t = server_tool();
  auto bare = t.parse({"--tls"});
  auto off = t.parse({"--tls=false"});
  auto on = t.parse({"--tls=true"});
  auto none = t.parse({});
  ASSERT_TRUE(bare.ok() && off.ok() && on.ok() && none.ok());
  EXPECT_TRUE(bare->on("tls"));
  EXPECT_TRUE(on->on("tls"));
  EXPECT_FALSE(off->on("tls"));
  EXPECT_TRUE(off->has("tls"));
  EXPECT_FALSE(none->on("tls"));
  EXPECT_EQ(none->get("tls"), "false");
  EXPECT_EQ(error_of(t, {"--tls=yes"}), "--tls takes true or false, got 'yes'");
  // A boolean never takes the next argument.
  EXPECT_EQ(error_of(t, {"--tls", "false"}), "unexpected argument 'false' for 'srv'");
}

TEST(Flags, TypedValuesAreChecked) {
  Tool t = server_tool();
  EXPECT_EQ(error_of(t, {"--workers=two"}), "--workers takes a non-negative integer, got 'two'");
  EXPECT_EQ(error_of(t, {"--workers=-1"}), "--workers takes a non-negative integer, got '-1'");
  EXPECT_EQ(error_of(t, {"--workers="}), "--workers takes a non-negative integer, got ''");
  EXPECT_EQ(error_of(t, {"--threads", "5000"}), "--threads takes an integer from 0 to 4096, got '5000'");
  EXPECT_EQ(error_of(t, {"--workers=99999999999999999999"}),
            "--workers takes a non-negative integer, got '99999999999999999999'");
  EXPECT_EQ(error_of(t, {"--lane=tcp"}), "--lane takes shm or grpc, got 'tcp'");
  auto a = t.parse({"--lane", "grpc", "--threads=4096"});
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->get("lane"), "grpc");
  EXPECT_EQ(a->integer("threads"), 4096);
}

TEST(Flags, OptionalValueNeverTakesTheNextArgument) {
  Tool t = server_tool();
  auto bare = t.parse({"--embedded", "--tls"});
  ASSERT_TRUE(bare.ok()) << bare.status();
  EXPECT_TRUE(bare->has("embedded"));
  EXPECT_EQ(bare->get("embedded"), "");
  auto pid = t.parse({"--embedded=42"});
  ASSERT_TRUE(pid.ok());
  EXPECT_EQ(pid->integer("embedded"), 42);
  EXPECT_EQ(error_of(t, {"--embedded=0"}), "--embedded takes an integer from 1 to 2147483647, got '0'");
  EXPECT_EQ(error_of(t, {"--embedded", "42"}), "unexpected argument '42' for 'srv'");
}

TEST(Flags, UnknownOptionsAndArgumentsNameTheCommand) {
  Tool t = server_tool();
  EXPECT_EQ(error_of(t, {"--bogus"}), "--bogus is not an option of 'srv'");
  EXPECT_EQ(error_of(t, {"-x"}), "-x is not an option of 'srv'");
  EXPECT_EQ(error_of(t, {"stray"}), "unexpected argument 'stray' for 'srv'");
  Tool c = client_tool();
  // run's option is not stats' option.
  EXPECT_EQ(error_of(c, {"stats", "--in", "x=y.npy"}), "--in is not an option of 'cli stats'");
  EXPECT_EQ(error_of(c, {"stats", "g.json"}), "unexpected argument 'g.json' for 'cli stats'");
  EXPECT_EQ(error_of(c, {"run"}), "'cli run' needs GRAPH");
  EXPECT_EQ(error_of(c, {"convert", "g.json"}), "'cli convert' needs OUT");
  EXPECT_EQ(error_of(c, {"frobnicate"}), "unknown command 'frobnicate'");
  EXPECT_EQ(error_of(c, {"help", "frobnicate"}), "unknown command 'frobnicate'");
}

TEST(Flags, CommandsPositionalsAndRepeatedOptions) {
  Tool t = client_tool();
  // Options before the command, common ones after it, and a one-letter option.
  auto a = t.parse({"--server", "h:1", "run", "g.json", "--in", "x=a.npy", "--in=y=b.npy", "-o", "out.json", "--embedded"});
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->command, "run");
  EXPECT_EQ(a->positional, std::vector<std::string>{"g.json"});
  EXPECT_EQ(a->all("in"), (std::vector<std::string>{"x=a.npy", "y=b.npy"}));
  EXPECT_EQ(a->get("in"), "y=b.npy");
  EXPECT_EQ(a->get("o"), "out.json");
  EXPECT_EQ(a->get("server"), "h:1");
  EXPECT_TRUE(a->on("embedded"));
  EXPECT_TRUE(a->all("nothing").empty());

  auto cases = t.parse({"test", "a", "b", "c"});
  ASSERT_TRUE(cases.ok());
  EXPECT_EQ(cases->positional.size(), 3u);
  auto none = t.parse({"test"});
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->positional.empty());
  // "--" ends the options.
  auto dash = t.parse({"test", "--", "--odd-dir"});
  ASSERT_TRUE(dash.ok()) << dash.status();
  EXPECT_EQ(dash->positional, std::vector<std::string>{"--odd-dir"});
  auto bare = t.parse({});
  ASSERT_TRUE(bare.ok());
  EXPECT_TRUE(bare->command.empty());
  EXPECT_FALSE(bare->help);
}

TEST(Flags, HelpPerCommand) {
  Tool t = client_tool();
  for (const auto& argv : std::vector<std::vector<std::string>>{{"help", "run"}, {"run", "--help"}, {"run", "-h"}}) {
    auto a = t.parse(argv);
    ASSERT_TRUE(a.ok()) << a.status();
    EXPECT_TRUE(a->help);
    EXPECT_EQ(a->command, "run");  // and no complaint that GRAPH is missing
  }
  auto all = t.parse({"help"});
  ASSERT_TRUE(all.ok());
  EXPECT_TRUE(all->help);
  EXPECT_TRUE(all->command.empty());

  std::string run = t.help("run");
  EXPECT_NE(run.find("usage: cli run GRAPH [options]"), std::string::npos) << run;
  EXPECT_NE(run.find("--in=NAME=FILE"), std::string::npos) << run;
  EXPECT_NE(run.find("an input (repeatable)"), std::string::npos) << run;
  EXPECT_NE(run.find("-o OUT"), std::string::npos) << run;
  EXPECT_NE(run.find("--server=HOST:PORT"), std::string::npos) << run;  // the common options too
  EXPECT_EQ(run.find("the counters"), std::string::npos) << run;        // not the other commands
  std::string overview = t.help();
  for (const char* s : {"usage: cli COMMAND", "run GRAPH", "convert GRAPH OUT", "test CASE_DIR...", "stats", "--in=NAME=FILE"})
    EXPECT_NE(overview.find(s), std::string::npos) << s << "\n" << overview;
}

TEST(Flags, HelpListsEveryOptionWithItsDefault) {
  Tool t = server_tool();
  std::string h = t.help();
  for (const char* s : {"usage: srv [options]", "--listen=HOST:PORT", "(default: 127.0.0.1:7070)", "--workers=N",
                        "(default: 2)", "--cache-dir=DIR", "(default: $XDG_CACHE_HOME/srv)", "--tls ", "--lane=shm|grpc",
                        "--embedded[=PID]", "--help", "Exit status: 0 ok."})
    EXPECT_NE(h.find(s), std::string::npos) << s << "\n" << h;
  EXPECT_EQ(h.find("(default: false)"), std::string::npos) << h;
  for (size_t at = 0, nl; at < h.size(); at = nl + 1) {
    nl = h.find('\n', at);
    if (nl == std::string::npos) nl = h.size();
    EXPECT_LE(nl - at, 96u) << h.substr(at, nl - at);
  }
}

}  // namespace
}  // namespace uop::flags
