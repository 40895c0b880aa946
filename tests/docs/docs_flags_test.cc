// Every flag the docs name exists: each `--flag` in README.md and docs/*.md is checked against
// the program it is given to (kvstream-prefill, kvstream-decode, kvstream <command>, a program
// or script of bench/), and a flag that names no program against all of theirs. The daemons' and
// the CLI's flags come from the built binaries' --help; a bench program's from its source.
// Flags of other tools (cmake, ctest, ...) are not checked. The deploy files (deploy/: container
// file, manifests, units, scripts) are checked the same way, one command per line, and the keys
// of deploy/configs/*.json are the daemons' flags.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace kvstream {
namespace {

namespace fs = std::filesystem;
using FlagSet = std::set<std::string>;

std::string RunForOutput(const std::string& cmd) {
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  EXPECT_NE(p, nullptr) << cmd;
  if (!p) return "";
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  const int status = pclose(p);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << cmd << ":\n" << out;
  return out;
}

std::string ReadFile(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A flag: "--" and a lower-case name, not inside a longer word ("a--b", "--Generate-->" in a
// diagram are not flags).
const std::regex& FlagPattern() {
  static const std::regex re(R"((^|[^\w-])--([a-z][a-z0-9_-]*[a-z0-9]))");
  return re;
}

FlagSet FlagsIn(const std::string& text) {
  FlagSet out;
  for (std::sregex_iterator it(text.begin(), text.end(), FlagPattern()), end; it != end; ++it)
    out.insert((*it)[2]);
  return out;
}

// The daemons read "-" and "_" alike in a flag's name.
FlagSet BothSpellings(const FlagSet& flags) {
  FlagSet out;
  for (std::string f : flags) {
    out.insert(f);
    for (char& c : f) c = c == '_' ? '-' : c;
    out.insert(f);
    for (char& c : f) c = c == '-' ? '_' : c;
    out.insert(f);
  }
  return out;
}

// The names in a usage listing's "  name   summary" lines.
std::vector<std::string> ListedCommands(const std::string& usage) {
  std::vector<std::string> out;
  static const std::regex line(R"(^  ([a-z][a-z-]*)\s{2,}\S)");
  std::istringstream in(usage);
  for (std::string l; std::getline(in, l);) {
    std::smatch m;
    if (std::regex_search(l, m, line)) out.push_back(m[1]);
  }
  return out;
}

// What the docs may give flags to. A program's key is how the docs call it: "kvstream-prefill",
// "kvstream bench itl", "decode_attention" (a bench program or script, by file stem).
struct Programs {
  std::map<std::string, FlagSet> flags;
  FlagSet all;
  std::vector<std::string> cli_commands;  // "generate", "bench ttft", ...
};

Programs CollectPrograms() {
  Programs p;
  const std::string cli = KVSTREAM_CLI_BIN;
  const std::pair<std::string, std::string> daemons[] = {
      {"kvstream-prefill", KVSTREAM_PREFILL_BIN}, {"kvstream-decode", KVSTREAM_DECODE_BIN}};
  for (const auto& [name, bin] : daemons) {
    FlagSet f = FlagsIn(RunForOutput(bin + " --help"));
    f.insert({"help", "config"});
    p.flags[name] = BothSpellings(f);
  }
  for (const std::string& cmd : ListedCommands(RunForOutput(cli + " help"))) {
    std::vector<std::string> subs = {cmd};
    if (cmd == "bench") {  // bench <what>
      subs.clear();
      for (const std::string& what : ListedCommands(RunForOutput(cli + " bench --help")))
        subs.push_back("bench " + what);
    }
    for (const std::string& sub : subs) {
      FlagSet f = FlagsIn(RunForOutput(cli + " " + sub + " --help"));
      f.insert("help");
      p.flags["kvstream " + sub] = f;
      p.cli_commands.push_back(sub);
    }
  }
  // generate --decode runs the request through the daemons, with flags of its own.
  for (const std::string& f : FlagsIn(RunForOutput(cli + " generate --decode x --help")))
    p.flags["kvstream generate"].insert(f);
  const fs::path bench = fs::path(KVSTREAM_SOURCE_DIR) / "bench";
  for (const auto& entry : fs::recursive_directory_iterator(bench)) {
    const fs::path& path = entry.path();
    const std::string ext = path.extension().string();
    if (path.string().find("/results/") != std::string::npos) continue;
    if (ext != ".cc" && ext != ".cu" && ext != ".py" && ext != ".sh") continue;
    FlagSet& f = p.flags[path.stem().string()];
    for (const std::string& flag : FlagsIn(ReadFile(path))) f.insert(flag);
  }
  // scripts/*.sh, by path ("scripts/install-deps.sh --ucx-cuda").
  for (const auto& entry : fs::directory_iterator(fs::path(KVSTREAM_SOURCE_DIR) / "scripts")) {
    if (entry.path().extension() != ".sh") continue;
    p.flags["scripts/" + entry.path().filename().string()] = FlagsIn(ReadFile(entry.path()));
  }
  for (const auto& [name, f] : p.flags) p.all.insert(f.begin(), f.end());
  return p;
}

// Tools not of this repository: their flags are theirs to document.
bool IsOtherTool(const std::string& word) {
  static const std::set<std::string> tools = {
      "cmake", "ctest", "ninja", "nvcc", "python3", "pip", "git", "docker", "kubectl", "helm",
      "srun", "sbatch", "salloc", "systemctl", "journalctl", "compute-sanitizer", "nsys", "ncu",
      "nvidia-smi", "nvidia-cuda-mps-control", "cuobjdump", "ucx_info", "grpcurl", "curl", "apt-get",
      "numactl", "taskset", "torchrun", "configure", "podman", "buildah", "debootstrap",
      "useradd", "yamllint", "systemd-analyze", "openssl", "grpc_health_probe", "ccache", "strip",
      "xargs", "dpkg", "ldd", "node", "npm", "fio"};
  return tools.count(word) != 0;
}

struct Finding {
  std::string where;    // file:line
  std::string flag;
  std::string program;  // empty: no program named, checked against all
};

// Checks one command or one inline code span. Flags are checked against the program named
// last before them; before any, against all programs.
void CheckSegment(const Programs& p, const std::string& text, const std::string& where,
                  std::vector<Finding>* missing, int* checked) {
  // Program names, in order of appearance: "kvstream-prefill", "kvstream bench itl", a bench
  // program or script ("build/bin/decode_attention", "bench/auto_table.py"), another tool.
  static const std::regex word(R"((^|[\s`(/|;&])([a-z][a-z0-9_.-]*))");
  struct Mark {
    size_t pos;
    std::string program;  // "" = another tool (flags not checked)
  };
  std::vector<Mark> marks;
  for (std::sregex_iterator it(text.begin(), text.end(), word), end; it != end; ++it) {
    const std::string w = (*it)[2];
    const size_t pos = it->position(2);
    std::string stem = w;
    for (const char* ext : {".py", ".sh", ".cu", ".cc"}) {
      if (stem.size() > 3 && stem.compare(stem.size() - 3, 3, ext) == 0)
        stem.resize(stem.size() - 3);
    }
    if (w == "kvstream-prefill" || w == "kvstream-decode") {
      marks.push_back({pos, w});
    } else if (w == "kvstream") {
      // The longest command that follows: "bench itl" before "bench".
      const std::string rest = text.substr(pos + w.size());
      std::string best;
      for (const std::string& cmd : p.cli_commands) {
        const std::regex after("^\\s+" + std::regex_replace(cmd, std::regex(" "), "\\s+") +
                               "(?![\\w-])");
        if (cmd.size() > best.size() && std::regex_search(rest, after)) best = cmd;
      }
      if (!best.empty()) marks.push_back({pos, "kvstream " + best});
    } else if (w == "scripts") {
      const std::string path = text.substr(pos, text.find_first_of(" `),;|", pos) - pos);
      if (p.flags.count(path)) marks.push_back({pos, path});
    } else if (IsOtherTool(w)) {
      marks.push_back({pos, ""});
    } else if (p.flags.count(stem) && stem.rfind("kvstream", 0) != 0 &&
               (stem.find('_') != std::string::npos || (pos > 0 && text[pos - 1] == '/'))) {
      // A bench program by a name no sentence uses ("decode_attention") or by its path.
      marks.push_back({pos, stem});
    }
  }
  for (std::sregex_iterator it(text.begin(), text.end(), FlagPattern()), end; it != end; ++it) {
    const std::string flag = (*it)[2];
    const size_t pos = it->position(2);
    const Mark* mark = nullptr;
    for (const Mark& m : marks)
      if (m.pos < pos) mark = &m;
    if (mark && mark->program.empty()) continue;  // another tool's flag
    ++*checked;
    const FlagSet& known = mark ? p.flags.at(mark->program) : p.all;
    if (!known.count(flag)) missing->push_back({where, flag, mark ? mark->program : ""});
  }
}

// Code blocks: one segment per command (a line ending in "\" or a more indented line continues
// it). Prose: one segment per inline code span, and the text outside spans as one.
void CheckMarkdown(const Programs& p, const std::string& name, const std::string& text,
                   std::vector<Finding>* missing, int* checked) {
  std::istringstream in(text);
  bool in_code = false;
  size_t fence_indent = 0;
  std::string command, command_where;
  bool continues = false;
  auto flush = [&] {
    if (!command.empty()) CheckSegment(p, command, command_where, missing, checked);
    command.clear();
  };
  int n = 0;
  for (std::string line; std::getline(in, line);) {
    ++n;
    const std::string where = name + ":" + std::to_string(n);
    const size_t indent = line.find_first_not_of(' ') == std::string::npos
                              ? line.size()
                              : line.find_first_not_of(' ');
    if (line.compare(indent, 3, "```") == 0) {
      flush();
      in_code = !in_code;
      fence_indent = indent;
      continues = false;
      continue;
    }
    if (in_code) {
      if (!(continues || (indent > fence_indent && !command.empty() && indent < line.size()))) {
        flush();
        command_where = where;
      }
      command += " " + line;
      continues = !line.empty() && line.back() == '\\';
      continue;
    }
    std::string outside;
    size_t i = 0;
    while (i < line.size()) {
      const size_t open = line.find('`', i);
      if (open == std::string::npos) {
        outside += line.substr(i);
        break;
      }
      const size_t close = line.find('`', open + 1);
      if (close == std::string::npos) {
        outside += line.substr(i);
        break;
      }
      outside += line.substr(i, open - i) + " ";
      CheckSegment(p, line.substr(open + 1, close - open - 1), where, missing, checked);
      i = close + 1;
    }
    CheckSegment(p, outside, where, missing, checked);
  }
  flush();
}

std::string Describe(const std::vector<Finding>& findings) {
  std::string out;
  for (const Finding& f : findings)
    out += f.where + ": --" + f.flag + " is not a flag of " +
           (f.program.empty() ? std::string("any program here") : f.program) + "\n";
  return out;
}

class DocsFlagsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { programs_ = new Programs(CollectPrograms()); }
  static void TearDownTestSuite() { delete programs_; }
  static Programs* programs_;
};
Programs* DocsFlagsTest::programs_ = nullptr;

TEST_F(DocsFlagsTest, EveryProgramIsAsked) {
  const Programs& p = *programs_;
  for (const char* program : {"kvstream-prefill", "kvstream-decode", "kvstream generate",
                              "kvstream stats", "kvstream bench ttft", "kvstream bench itl"}) {
    ASSERT_TRUE(p.flags.count(program)) << program;
    EXPECT_GT(p.flags.at(program).size(), 2u) << program;
  }
  EXPECT_TRUE(p.flags.at("kvstream-prefill").count("pool_blocks"));
  EXPECT_TRUE(p.flags.at("kvstream-decode").count("pool-blocks"));  // both spellings
  EXPECT_TRUE(p.flags.at("kvstream generate").count("decode"));     // the remote form's
}

TEST_F(DocsFlagsTest, TheCheckFindsWhatIsMissing) {
  std::vector<Finding> missing;
  int checked = 0;
  CheckMarkdown(*programs_, "sample.md",
                "Run `kvstream stats --decode A --pool_blocks 4` and `--no-such-flag`.\n"
                "```\n"
                "kvstream-prefill --model tiny \\\n"
                "    --prompt-lens 1\n"
                "kvstream bench itl --decode A\n"
                "                   --streams 2 --peer x\n"
                "cmake --build build --target all\n"
                "scripts/test.sh --no-such-option\n"
                "```\n",
                &missing, &checked);
  EXPECT_EQ(checked, 9);
  EXPECT_EQ(Describe(missing),
            "sample.md:1: --pool_blocks is not a flag of kvstream stats\n"
            "sample.md:1: --no-such-flag is not a flag of any program here\n"
            "sample.md:3: --prompt-lens is not a flag of kvstream-prefill\n"
            "sample.md:5: --peer is not a flag of kvstream bench itl\n"
            "sample.md:8: --no-such-option is not a flag of scripts/test.sh\n");
}

// README.md, docs/*.md and every other Markdown file of the tree, except bench/results/ (records
// of past runs, with the commands of their day) and build directories.
std::vector<fs::path> DocFiles() {
  const fs::path root = KVSTREAM_SOURCE_DIR;
  std::vector<fs::path> files;
  for (auto it = fs::recursive_directory_iterator(root); it != fs::recursive_directory_iterator();
       ++it) {
    const fs::path& path = it->path();
    if (it->is_directory()) {
      if (path.filename() == ".git" || path == root / "bench" / "results" ||
          fs::exists(path / "CMakeCache.txt"))
        it.disable_recursion_pending();
    } else if (path.extension() == ".md") {
      files.push_back(path);
    }
  }
  std::sort(files.begin(), files.end());
  return files;
}

TEST_F(DocsFlagsTest, EveryFlagTheDocsNameExists) {
  const std::vector<fs::path> files = DocFiles();
  for (const char* must : {"README.md", "docs/daemons.md", "docs/pacing.md"})
    EXPECT_NE(std::find(files.begin(), files.end(), fs::path(KVSTREAM_SOURCE_DIR) / must),
              files.end()) << must;
  std::vector<Finding> missing;
  int checked = 0;
  for (const fs::path& f : files) {
    const std::string name = fs::relative(f, KVSTREAM_SOURCE_DIR).string();
    CheckMarkdown(*programs_, name, ReadFile(f), &missing, &checked);
  }
  EXPECT_GT(checked, 100);  // the docs name many flags: a broken scan would see none
  EXPECT_TRUE(missing.empty()) << Describe(missing);
}

// deploy/: every file but Markdown (checked above), a line a command (a line ending in "\"
// continues it); '#' comments are checked too (they show commands).
std::vector<fs::path> DeployFiles() {
  std::vector<fs::path> files;
  for (const auto& e : fs::recursive_directory_iterator(fs::path(KVSTREAM_SOURCE_DIR) / "deploy"))
    if (e.is_regular_file() && e.path().extension() != ".md") files.push_back(e.path());
  std::sort(files.begin(), files.end());
  return files;
}

void CheckLines(const Programs& p, const std::string& name, const std::string& text,
                std::vector<Finding>* missing, int* checked) {
  std::istringstream in(text);
  std::string command, command_where;
  int n = 0;
  for (std::string line; std::getline(in, line);) {
    ++n;
    if (command.empty()) command_where = name + ":" + std::to_string(n);
    if (line.rfind("#SBATCH", 0) == 0) line = "sbatch" + line.substr(7);  // sbatch's own flags
    command += " " + line;
    if (!line.empty() && line.back() == '\\') continue;
    CheckSegment(p, command, command_where, missing, checked);
    command.clear();
  }
  if (!command.empty()) CheckSegment(p, command, command_where, missing, checked);
}

TEST_F(DocsFlagsTest, EveryFlagTheDeployFilesNameExists) {
  const std::vector<fs::path> files = DeployFiles();
  std::vector<Finding> missing;
  int checked = 0, config_keys = 0;
  for (const fs::path& f : files) {
    const std::string name = fs::relative(f, KVSTREAM_SOURCE_DIR).string();
    const std::string text = ReadFile(f);
    if (f.extension() == ".json" && f.parent_path().filename() == "configs") {
      // A daemon config: every key is a flag of the daemon its name starts with.
      const std::string program = name.find("prefill") != std::string::npos
                                      ? "kvstream-prefill" : "kvstream-decode";
      const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
      ASSERT_TRUE(j.is_object()) << name;
      for (const auto& [key, value] : j.items()) {
        ++config_keys;
        if (!programs_->flags.at(program).count(key)) missing.push_back({name, key, program});
      }
      continue;
    }
    CheckLines(*programs_, name, text, &missing, &checked);
  }
  EXPECT_GT(checked, 10);  // the units, the manifests and the scripts name flags
  EXPECT_GT(config_keys, 20);
  EXPECT_TRUE(missing.empty()) << Describe(missing);
}

TEST_F(DocsFlagsTest, TheDeployCheckFindsWhatIsMissing) {
  std::vector<Finding> missing;
  int checked = 0;
  CheckLines(*programs_, "x.service",
             "ExecStart=/usr/local/bin/kvstream-decode --config /etc/x.json \\\n"
             "    --no_such_key 1\n"
             "command: [\"/usr/local/bin/kvstream-prefill\", \"--peer\", \"a:1\"]\n"
             "RUN useradd --system kvstream\n"
             "#SBATCH --nodes=2\n",
             &missing, &checked);
  EXPECT_EQ(checked, 3);
  EXPECT_EQ(Describe(missing),
            "x.service:1: --no_such_key is not a flag of kvstream-decode\n");
}

}  // namespace
}  // namespace kvstream
