// dflash_runner: drives a dflash-et DFlash program (.pte) through the ExecuTorch C++
// runtime (extension/module), for several owners (requests) at once.
//
// The step loop is the one of docs/CONTRACT.md, call for call the loop of
// export/driver.py (the reference): the same owners give the same tokens.
//
//   join:   target_prefill (prompt chunks of <= max_rows rows) -> first token, hidden
//           draft_prefill  (the same hidden, offsets, positions, slots)
//   step:   draft_forward  (previous target_verify hidden, its row starts, committed
//                           counts; pending tokens)         -> drafts
//           target_verify  ([pending, drafts] per owner)   -> accepted, next_token, hidden
//           commit drafts[:accepted] + next_token; committed = accepted + 1
//   leave:  drop the owner; its slot is free for the next join
//
// Only token ids and counts are read from method outputs. `hidden` is never looked at:
// its bytes are copied into a runner-owned tensor right after the call, because the
// Module shares its memory arenas across methods (the KV caches live there) and so a
// method's outputs alias memory the next call reuses.
//
// CUDA programs (model.pte + aoti_cuda_blob.ptd, a runner built with -DDFLASH_RUNNER_CUDA=ON):
// the same loop. The methods are loaded into one share_constants_group of the CUDA backend
// (our patch of ExecuTorch 1.2.0), so the KV and drafter caches, constants of each method's
// AOTInductor library, are one set of GPU tensors; the methods run on one CUDA stream; the
// outputs of target_prefill and target_verify stay on the GPU: `hidden` goes from there into
// the next method as is (no copy), and only the ids and counts are copied to the host.
//
// Exit codes: 0 done; 1 the program failed at run time (a method returned an error or
// broke the contract); 2 bad input (usage, a missing or foreign program file, a
// program this runner does not understand, owners the program cannot serve).

#include <executorch/extension/module/module.h>
#include <executorch/extension/tensor/tensor.h>
#include <executorch/runtime/backend/interface.h>
#include <executorch/runtime/platform/platform.h>
#ifdef DFLASH_RUNNER_CUDA
#include <cuda_runtime.h>
#if __has_include(<cuda_profiler_api.h>)
#include <cuda_profiler_api.h>
#else  // (the CUDA headers Triton ships, which tests/examples/test_cpp_runner.py compiles against, lack it)
extern "C" cudaError_t cudaProfilerStart();
extern "C" cudaError_t cudaProfilerStop();
#endif
#include <executorch/runtime/backend/backend_options_map.h>
#include <executorch/runtime/backend/options.h>
#include <executorch/extension/data_loader/file_data_loader.h>
#include <executorch/extension/flat_tensor/flat_tensor_data_map.h>

#include "cuda/shim_check.h"
#endif

#include <algorithm>
#include <array>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <numeric>
#include <set>
#include <stdexcept>
#include <string>
#include <unordered_set>
#include <vector>

namespace {

using executorch::aten::ScalarType;
using executorch::aten::SizesType;
using executorch::aten::Tensor;
using executorch::extension::make_tensor_ptr;
using executorch::extension::TensorPtr;
using executorch::extension::module::Module;
using executorch::runtime::Error;
using executorch::runtime::EValue;

constexpr int64_t kContractVersion = 2;  // docs/CONTRACT.md
constexpr int kExitFailed = 1;
constexpr int kExitBadInput = 2;
constexpr int64_t kMaxStep = 1000000;  // the largest join step accepted

// A problem reported as one line on stderr and an exit code, never an abort.
struct Failure : std::runtime_error {
  int code;
  Failure(int exit_code, const std::string& message) : std::runtime_error(message), code(exit_code) {}
};

[[noreturn]] void bad_input(const std::string& message) { throw Failure(kExitBadInput, message); }
[[noreturn]] void failed(const std::string& message) { throw Failure(kExitFailed, message); }

std::string error_name(Error e) { return executorch::runtime::to_string(e); }

// The runtime's own log: its errors (they say why a load or a call failed) go to stderr,
// its info lines (CPU probing at start-up) are dropped, so stdout/stderr stay parseable.
void emit_runtime_log(et_timestamp_t, et_pal_log_level_t level, const char* filename, const char*, size_t line,
                      const char* message, size_t length) {
  if (level == kError || level == kFatal) {
    std::fprintf(stderr, "executorch: %c %s:%zu] %.*s\n", static_cast<char>(level), filename, line,
                 static_cast<int>(length), message);
  }
}

std::string num(double value) {  // as the user wrote it, not std::to_string's 0.500000
  char text[32];
  std::snprintf(text, sizeof text, "%g", value);
  return text;
}

std::string join(const std::vector<int64_t>& values, const char* sep = " ") {
  std::string out;
  for (size_t i = 0; i < values.size(); ++i) out += (i ? sep : "") + std::to_string(values[i]);
  return out;
}

// ---------------------------------------------------------------------------------
// Command line

const char* kUsage = R"(usage: dflash_runner --program MODEL.pte [--data BLOB.ptd] --owner SPEC [--owner SPEC ...]
                     [--owners FILE] [--target-only] [--drafts] [--timing] [--cuda-graphs]
                     [--profile-steps]

Drives a dflash-et DFlash program (contract_version 1, docs/CONTRACT.md) through the
ExecuTorch C++ runtime: prefill, draft, verify, commit, for every owner at once.

  --program PATH   the model.pte of `dflash-et export` (program: dflash)
  --data PATH      a CUDA program's aoti_cuda_blob.ptd (compiled code and weights), written beside
                   its model.pte; checked against that export's manifest.json. CUDA programs need
                   a runner built with -DDFLASH_RUNNER_CUDA=ON (scripts/build-cuda-runner.sh)
  --owner SPEC     one owner (request); give it once per owner, up to the program's max_owners.
                   SPEC is key=value fields separated by ':'
                     prompt=1,2,3      prompt token ids, comma-separated (required)
                     max_new=12        tokens to generate, the first one from prefill included (required)
                     temperature=0.8   0 = greedy (default 0; a greedy program takes greedy owners only)
                     top_k=40          0 = off (default 0)
                     top_p=0.9         in (0, 1]; 1 = off (default 1)
                     seed=7            int64 (default 0)
                     join=0            the step at which the owner joins, <= 1000000 (default 0)
                     leave=5           the step before which it leaves, done or not (default: never)
                   e.g. --owner prompt=5,17,42:max_new=16:temperature=0.8:top_k=40:top_p=0.9:seed=7
  --owners FILE    owners from a file, one SPEC a line (blank lines and lines starting with '#'
                   skipped), after those of any --owner before it: long prompts that a command
                   line cannot hold
  --target-only    verify the pending token alone (plain decoding, no drafts): the tokens
                   must be the same as the speculative loop's
  --drafts         also print every step's draft_forward drafts
  --timing         also print per-method call times (median, mean; <method>.host: until the call
                   returned to the host, before the GPU finished) and committed tokens per second
  --cuda-graphs    CUDA programs: replay each method's calls as CUDA graphs (captured at the second
                   call of each input shape, up to 8 shapes a method; a call that a graph cannot
                   hold runs as it is, with a logged error): one launch a call instead of one per
                   kernel. Tokens are the same; prints a 'cuda_graphs' record
  --profile-steps  CUDA programs: open the CUDA profiler's capture range around each step
                   (draft_forward, target_verify, the commit) and close it before any prefill, so
                   that `ncu --profile-from-start off` (or `nsys profile --capture-range=cudaProfilerApi`)
                   sees the decoding steps only, not the prompts' prefill
  --no-shared-state  CUDA build, diagnostic only: load the methods without sharing their state, so
                   target_verify does not see the caches target_prefill wrote (the tokens are then
                   wrong; the GPU test uses this to show that the sharing is what makes them right)
  -h, --help       this text

Output (stdout), one record a line:
  constants <key>=<value> ...
  owner <i>: <its parameters>
  step <s> owners <n> tokens <t> acceptance <accepted+1 per owner, '-' for none>
  step <s> drafts <per owner: its block_size-1 drafts, comma-separated>  (--drafts; steps with owners)
  owner <i> tokens: <committed token ids>
  owner <i> stats: verifies <v> committed <c> mean_acceptance <c/v>
  total: steps <s> verifies <v> committed <c> mean_acceptance <m> tokens_per_step <t>
  timing <method> calls <n> median_us <m> mean_us <a>   (--timing; 'step' is draft + verify + commit)
  timing loop seconds <s> committed <c> tokens_per_second <r>   (--timing; prefill included)
  cuda_graphs captured <g> replayed <r>   (--cuda-graphs: graphs captured, calls that ran as one)
(<i> counts the owners from 0, in the order given; committed = tokens committed by target_verify,
the sum of accepted+1; the first token, from target_prefill, is not in it.)

Exit status: 0 done, 1 the program failed at run time, 2 bad input or a program this
runner does not understand.
)";

struct OwnerOptions {
  std::vector<int64_t> prompt;
  int64_t max_new = 0;
  double temperature = 0.0;
  int64_t top_k = 0;
  double top_p = 1.0;
  int64_t seed = 0;
  int64_t join = 0;
  int64_t leave = -1;  // -1: never
};

struct Options {
  std::string program;
  std::string data;  // the .ptd of a CUDA program
  std::vector<OwnerOptions> owners;
  bool target_only = false;
  bool drafts = false;
  bool timing = false;
  bool shared_state = true;
  bool cuda_graphs = false;
  bool profile_steps = false;
};

int64_t parse_int(const std::string& text, const std::string& what) {
  int64_t value = 0;
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (text.empty() || ec != std::errc() || ptr != end) {
    bad_input(what + " must be an integer (int64), got '" + text + "'");
  }
  return value;
}

double parse_float(const std::string& text, const std::string& what) {
  // strtod, then the float32 cast where the value is used: the rounding of Python's
  // torch.tensor([float(text)], dtype=float32), so parameters match the reference bit for bit.
  char* end = nullptr;
  errno = 0;
  double value = std::strtod(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size() || errno == ERANGE || !std::isfinite(value)) {
    bad_input(what + " must be a finite number, got '" + text + "'");
  }
  return value;
}

std::vector<std::string> split(const std::string& text, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  while (true) {
    size_t end = text.find(sep, start);
    out.push_back(text.substr(start, end == std::string::npos ? std::string::npos : end - start));
    if (end == std::string::npos) return out;
    start = end + 1;
  }
}

OwnerOptions parse_owner(const std::string& spec, size_t index) {
  const std::string who = "--owner " + std::to_string(index) + " (" + spec + ")";
  const std::set<std::string> keys = {"prompt", "max_new", "temperature", "top_k", "top_p", "seed", "join", "leave"};
  OwnerOptions o;
  std::set<std::string> seen;
  for (const std::string& field : split(spec, ':')) {
    size_t eq = field.find('=');
    std::string key = field.substr(0, eq);
    if (eq == std::string::npos || !keys.count(key)) {
      bad_input(who + ": '" + field + "' is not key=value with a key among prompt, max_new, temperature, top_k, "
                "top_p, seed, join, leave");
    }
    if (!seen.insert(key).second) bad_input(who + ": " + key + " is given twice");
    std::string value = field.substr(eq + 1);
    std::string what = who + ": " + key;
    if (key == "prompt") {
      for (const std::string& t : split(value, ',')) o.prompt.push_back(parse_int(t, what + " token"));
    } else if (key == "max_new") {
      o.max_new = parse_int(value, what);
    } else if (key == "temperature") {
      o.temperature = parse_float(value, what);
    } else if (key == "top_k") {
      o.top_k = parse_int(value, what);
    } else if (key == "top_p") {
      o.top_p = parse_float(value, what);
    } else if (key == "seed") {
      o.seed = parse_int(value, what);
    } else if (key == "join") {
      o.join = parse_int(value, what);
    } else {
      o.leave = parse_int(value, what);
    }
  }
  if (!seen.count("prompt") || o.prompt.empty()) bad_input(who + ": give prompt=TOKEN,TOKEN,... (at least one token)");
  if (!seen.count("max_new") || o.max_new < 1) bad_input(who + ": give max_new=N with N >= 1");
  if (o.temperature < 0) bad_input(who + ": temperature must be >= 0 (0 = greedy), got " + num(o.temperature));
  if (o.top_k < 0) bad_input(who + ": top_k must be >= 0 (0 = off), got " + std::to_string(o.top_k));
  if (!(o.top_p > 0 && o.top_p <= 1)) bad_input(who + ": top_p must be in (0, 1] (1 = off), got " + num(o.top_p));
  // Steps before a join are empty but still steps: bound them so a typo cannot spin for ages.
  if (o.join < 0 || o.join > kMaxStep) {
    bad_input(who + ": join must be in [0, " + std::to_string(kMaxStep) + "], got " + std::to_string(o.join));
  }
  if (seen.count("leave") && o.leave <= o.join) {
    bad_input(who + ": leave (" + std::to_string(o.leave) + ") must be after join (" + std::to_string(o.join) + ")");
  }
  return o;
}

// Returns false when --help was asked for.
bool parse_args(int argc, char** argv, Options& options) {
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    auto value = [&](const std::string& flag) -> std::string {
      if (arg.rfind(flag + "=", 0) == 0) return arg.substr(flag.size() + 1);
      if (i + 1 >= argc) bad_input(flag + " needs a value (see --help)");
      return argv[++i];
    };
    if (arg == "-h" || arg == "--help") return false;
    if (arg == "--target-only") {
      options.target_only = true;
    } else if (arg == "--drafts") {
      options.drafts = true;
    } else if (arg == "--timing") {
      options.timing = true;
    } else if (arg == "--no-shared-state") {
      options.shared_state = false;
    } else if (arg == "--cuda-graphs") {
      options.cuda_graphs = true;
    } else if (arg == "--profile-steps") {
      options.profile_steps = true;
    } else if (arg == "--data" || arg.rfind("--data=", 0) == 0) {
      options.data = value("--data");
    } else if (arg == "--program" || arg.rfind("--program=", 0) == 0) {
      options.program = value("--program");
    } else if (arg == "--owner" || arg.rfind("--owner=", 0) == 0) {
      options.owners.push_back(parse_owner(value("--owner"), options.owners.size()));
    } else if (arg == "--owners" || arg.rfind("--owners=", 0) == 0) {
      std::string path = value("--owners");
      std::ifstream file(path);
      if (!file) bad_input("--owners " + path + ": cannot read the file (one owner SPEC a line)");
      std::string line;
      while (std::getline(file, line)) {
        if (!line.empty() && line.back() == '\r') line.pop_back();
        if (line.empty() || line[0] == '#') continue;
        options.owners.push_back(parse_owner(line, options.owners.size()));
      }
    } else {
      bad_input("unknown argument '" + arg + "' (see --help)");
    }
  }
  if (options.program.empty()) bad_input("give the program: --program MODEL.pte (see --help)");
  if (options.owners.empty()) bad_input("give at least one --owner SPEC or an --owners FILE (see --help)");
  return true;
}

// ---------------------------------------------------------------------------------
// Files: a CUDA program's .ptd must be the one exported with its .pte. manifest.json,
// written beside both by `dflash-et export`, records every file's size and SHA-256.

void require_file(const std::string& path, const std::string& fix) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) bad_input(path + ": no such file (" + fix + ")");
  if (!std::filesystem::is_regular_file(path, ec)) bad_input(path + " is not a file (" + fix + ")");
}

// FIPS 180-4 SHA-256 of a file, as lowercase hex.
std::string sha256_file(const std::string& path) {
  static constexpr uint32_t k[64] = {
      0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
      0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
      0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
      0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
      0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
      0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
      0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
      0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};
  uint32_t h[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  auto rotr = [](uint32_t x, int n) { return (x >> n) | (x << (32 - n)); };
  auto block = [&](const uint8_t* p) {
    uint32_t w[64];
    for (int i = 0; i < 16; ++i) w[i] = uint32_t(p[4 * i]) << 24 | uint32_t(p[4 * i + 1]) << 16 | uint32_t(p[4 * i + 2]) << 8 | p[4 * i + 3];
    for (int i = 16; i < 64; ++i) {
      uint32_t s0 = rotr(w[i - 15], 7) ^ rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
      uint32_t s1 = rotr(w[i - 2], 17) ^ rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
      w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], hh = h[7];
    for (int i = 0; i < 64; ++i) {
      uint32_t t1 = hh + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) + k[i] + w[i];
      uint32_t t2 = (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
      hh = g, g = f, f = e, e = d + t1, d = c, c = b, b = a, a = t1 + t2;
    }
    h[0] += a, h[1] += b, h[2] += c, h[3] += d, h[4] += e, h[5] += f, h[6] += g, h[7] += hh;
  };
  std::ifstream in(path, std::ios::binary);
  if (!in) bad_input(path + ": cannot be read");
  std::vector<uint8_t> buffer(1 << 20);
  uint64_t total = 0;
  size_t n = 0;
  while (in.read(reinterpret_cast<char*>(buffer.data()), buffer.size()), (n = static_cast<size_t>(in.gcount())) > 0) {
    total += n;
    size_t whole = n / 64 * 64;
    for (size_t i = 0; i < whole; i += 64) block(buffer.data() + i);
    if (whole != n) {  // only the file's last read is not a multiple of 64 bytes
      std::memmove(buffer.data(), buffer.data() + whole, n - whole);
      n -= whole;
      break;
    }
    n = 0;
  }
  std::array<uint8_t, 128> tail{};
  std::memcpy(tail.data(), buffer.data(), n);
  tail[n] = 0x80;
  const size_t len = n + 1 + 8 <= 64 ? 64 : 128;
  for (int i = 0; i < 8; ++i) tail[len - 1 - i] = static_cast<uint8_t>((total * 8) >> (8 * i));
  for (size_t i = 0; i < len; i += 64) block(tail.data() + i);
  char hex[65];
  for (int i = 0; i < 8; ++i) std::snprintf(hex + 8 * i, 9, "%08x", h[i]);
  return hex;
}

struct FileRecord {
  bool found = false;
  uint64_t bytes = 0;
  std::string sha256;
};

// manifest.json's "files" entry of `name` (json.dumps(indent=2, sort_keys=True) of artifact.py).
FileRecord manifest_file(const std::string& manifest, const std::string& name) {
  FileRecord r;
  const size_t files = manifest.find("\"files\": {");
  const size_t at = files == std::string::npos ? files : manifest.find("\"" + name + "\": {", files);
  if (at == std::string::npos) return r;
  const std::string entry = manifest.substr(at, manifest.find('}', at) - at);
  const size_t bytes = entry.find("\"bytes\": "), sha = entry.find("\"sha256\": \"");
  if (bytes == std::string::npos || sha == std::string::npos) return r;
  r.bytes = std::strtoull(entry.c_str() + bytes + 9, nullptr, 10);
  r.sha256 = entry.substr(sha + 11, 64);
  r.found = true;
  return r;
}

// `data` is the .ptd exported with `pte`: the manifest beside the .pte lists both, with the
// sizes and SHA-256 of these very files. (A .ptd of another export holds another method
// library and weights: run, it would read inputs with the wrong shapes.)
void check_data_belongs(const std::string& pte, const std::string& data) {
  const std::filesystem::path manifest = std::filesystem::path(pte).parent_path() / "manifest.json";
  std::error_code ec;
  if (!std::filesystem::is_regular_file(manifest, ec)) {
    bad_input("no manifest.json beside " + pte + ": cannot check that " + data +
              " was exported with it (keep the files `dflash-et export` wrote together)");
  }
  std::ifstream in(manifest);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const FileRecord want_pte = manifest_file(text, "model.pte"), want_ptd = manifest_file(text, "aoti_cuda_blob.ptd");
  if (!want_ptd.found) bad_input(manifest.string() + " lists no aoti_cuda_blob.ptd: not a CUDA export of dflash-et");
  if (!want_pte.found || std::filesystem::file_size(pte) != want_pte.bytes || sha256_file(pte) != want_pte.sha256) {
    bad_input(manifest.string() + " is not the manifest of " + pte +
              " (it lists another model.pte): keep the files of one export together");
  }
  const uint64_t size = std::filesystem::file_size(data);
  if (size != want_ptd.bytes || sha256_file(data) != want_ptd.sha256) {
    bad_input(data + " is not the .ptd exported with " + pte + " (" + manifest.string() + " lists " +
              std::to_string(want_ptd.bytes) + " bytes, sha256 " + want_ptd.sha256.substr(0, 16) + "...; this file has " +
              std::to_string(size) + " bytes" + (size == want_ptd.bytes ? ", another sha256" : "") +
              "): give --data the aoti_cuda_blob.ptd of the same export");
  }
}

// ---------------------------------------------------------------------------------
// The program: constants, the contract check, method calls

ScalarType dtype_of(const std::string& model_dtype) {
  if (model_dtype == "float32") return ScalarType::Float;
  if (model_dtype == "bfloat16") return ScalarType::BFloat16;
  return ScalarType::Undefined;
}

class DFlashProgram {
 public:
  DFlashProgram(const std::string& path, const std::string& data, bool timing, bool shared_state,
                bool cuda_graphs)
      : path_(path), timing_(timing) {
    require_file(path, "give --program the model.pte written by `dflash-et export`");
    if (!data.empty()) require_file(data, "give --data the aoti_cuda_blob.ptd written beside the model.pte");
    // The program alone first: its constants and backend say whether the .ptd belongs to it.
    load_module("");
    check_contract();
    check_backend(data, shared_state, cuda_graphs);
    if (cuda_) load_module(data);  // the methods' code and weights are in the .ptd
#ifdef DFLASH_RUNNER_CUDA
    if (cuda_) warn_missing_shims(data);
#endif
    check_methods();
  }

  const std::string& path() const { return path_; }
  bool sampling() const { return variant == "sampling"; }
  bool cuda() const { return cuda_; }
  bool timing() const { return timing_; }

  // Runs `method`; every input is a runner-owned tensor. The returned EValues alias the
  // shared arenas (or, for a CUDA program, the backend's GPU buffers of the method's last
  // call): read or copy them before the method runs again.
  std::vector<EValue> call(const std::string& method, const std::vector<TensorPtr>& inputs, size_t num_outputs) {
    std::vector<EValue> args;
    args.reserve(inputs.size());
    for (const TensorPtr& t : inputs) args.emplace_back(*t);
    const auto start = std::chrono::steady_clock::now();
    auto out = module_->execute(method, args);
    if (!out.ok()) failed(method + " failed (" + error_name(out.error()) + ")");
    if (timing_) {
      // "<method>.host": until execute returns (input copies, launches, any sync inside the
      // method); near the whole call's time, the host bounds the method, not the GPU.
      const auto launched = std::chrono::steady_clock::now();
      synchronize();  // the GPU work, not just its launch
      const auto done = std::chrono::steady_clock::now();
      times[method].push_back(std::chrono::duration<double, std::micro>(done - start).count());
      times[method + ".host"].push_back(std::chrono::duration<double, std::micro>(launched - start).count());
    }
    if (out->size() != num_outputs) {
      failed(method + " returned " + std::to_string(out->size()) + " outputs, expected " + std::to_string(num_outputs));
    }
    return std::move(*out);
  }

  // Constants (docs/CONTRACT.md "Constant methods").
  int64_t contract_version = 0;
  std::string program, variant, model_dtype;
  int64_t vocab_size = 0, hidden_size = 0, num_target_layers = 0, hidden_width = 0;
  std::vector<int64_t> target_layer_ids;
  int64_t block_size = 0, mask_token_id = 0, max_rows = 0, max_owners = 0, max_seq_len = 0;
  ScalarType hidden_dtype = ScalarType::Undefined;
  // --timing: microseconds of every call, per method (and "step", filled by the loop).
  std::map<std::string, std::vector<double>> times;

  // --cuda-graphs: (graphs the backend captured, calls that ran as a graph).
  std::pair<int, int> cuda_graphs() const {
    int captured = 0, replayed = 0;
#ifdef DFLASH_RUNNER_CUDA
    executorch::runtime::BackendOptions<2> query;
    query.set_option("dflash_cuda_graphs_captured", 0);
    query.set_option("dflash_cuda_graphs_replayed", 0);
    auto view = query.view();
    if (executorch::runtime::get_option("CudaBackend", view) != Error::Ok) {
      failed("reading the CUDA backend's graph counters failed");
    }
    captured = std::get<int>(view[0].value);
    replayed = std::get<int>(view[1].value);
#endif
    return {captured, replayed};
  }

  void synchronize() const {
#ifdef DFLASH_RUNNER_CUDA
    if (cuda_ && cudaDeviceSynchronize() != cudaSuccess) failed("the GPU failed while running a method");
#endif
  }

 private:
  EValue constant(const std::string& name) {
    if (!names_.count(name)) {
      bad_input(path_ + " has no constant method '" + name + "': not a DFlash program of contract_version " +
                std::to_string(kContractVersion) + " (docs/CONTRACT.md)");
    }
    auto out = module_->execute(name);
    if (!out.ok() || out->size() != 1) bad_input(path_ + ": constant method '" + name + "' did not give one value");
    return out->at(0);
  }

  int64_t int_constant(const std::string& name) {
    EValue v = constant(name);
    if (!v.isInt()) bad_input(path_ + ": constant '" + name + "' is not an int");
    return v.toInt();
  }

  std::string string_constant(const std::string& name) {
    EValue v = constant(name);
    if (!v.isString()) bad_input(path_ + ": constant '" + name + "' is not a string");
    return std::string(v.toString());
  }

  std::vector<int64_t> ints_constant(const std::string& name) {
    EValue v = constant(name);
    if (!v.isTensor() || v.toTensor().scalar_type() != ScalarType::Long || v.toTensor().dim() != 1) {
      bad_input(path_ + ": constant '" + name + "' is not an int64 vector");
    }
    const Tensor& t = v.toTensor();
    return std::vector<int64_t>(t.const_data_ptr<int64_t>(), t.const_data_ptr<int64_t>() + t.numel());
  }

  void check_contract() {
    // contract_version 1 named its constants without get_: read either, refuse all but ours.
    const char* version_name = names_.count("get_contract_version") ? "get_contract_version"
                               : names_.count("contract_version")   ? "contract_version"
                                                                    : nullptr;
    if (version_name == nullptr) {
      bad_input(path_ + " has no 'get_contract_version' method: not a dflash-et program");
    }
    contract_version = int_constant(version_name);
    if (contract_version != kContractVersion) {
      bad_input(path_ + " has contract_version " + std::to_string(contract_version) + "; this runner understands " +
                "contract_version " + std::to_string(kContractVersion) +
                " only: re-export it with this dflash-et, or build the runner of the dflash-et that exported it");
    }
    program = string_constant("get_program");
    if (program != "dflash") {
      bad_input(path_ + " is a dflash-et '" + program + "' program; this runner drives DFlash programs " +
                "(program: dflash, e.g. the tiny-dflash-greedy / tiny-dflash-sampling configs)");
    }
    variant = string_constant("get_variant");
    if (variant != "greedy" && variant != "sampling") {
      bad_input(path_ + " has variant '" + variant + "'; this runner knows 'greedy' and 'sampling'");
    }
    model_dtype = string_constant("get_model_dtype");
    hidden_dtype = dtype_of(model_dtype);
    if (hidden_dtype == ScalarType::Undefined) {
      bad_input(path_ + " has model_dtype '" + model_dtype + "'; this runner knows 'float32' and 'bfloat16'");
    }
    vocab_size = int_constant("get_vocab_size");
    hidden_size = int_constant("get_hidden_size");
    num_target_layers = int_constant("get_n_target_layers");
    hidden_width = int_constant("get_hidden_width");
    target_layer_ids = ints_constant("get_target_layer_ids");
    block_size = int_constant("get_block_size");
    mask_token_id = int_constant("get_mask_token_id");
    max_rows = int_constant("get_max_rows");
    max_owners = int_constant("get_max_owners");
    max_seq_len = int_constant("get_max_seq_len");
    if (vocab_size < 1 || hidden_width < 1 || block_size < 2 || max_rows < 1 || max_owners < 1 || max_seq_len < 2) {
      bad_input(path_ + ": constants out of the contract's range (vocab_size " + std::to_string(vocab_size) +
                ", hidden_width " + std::to_string(hidden_width) + ", block_size " + std::to_string(block_size) +
                ", max_rows " + std::to_string(max_rows) + ", max_owners " + std::to_string(max_owners) +
                ", max_seq_len " + std::to_string(max_seq_len) + ")");
    }
  }

  void load_module(const std::string& data) {
    // share_memory_arenas: every method gets the same mem_id 1 (activations) and mem_id 2
    // (the mutable buffers: KV and drafter caches, placed once by name), so a cache written by
    // target_prefill is the one target_verify reads. The arenas start zero-filled.
    if (data.empty()) {
      module_ = std::make_unique<Module>(path_, Module::LoadMode::Mmap, /*event_tracer=*/nullptr,
                                         /*memory_allocator=*/nullptr, /*temp_allocator=*/nullptr,
                                         /*share_memory_arenas=*/true);
    } else {
      module_ = std::make_unique<Module>(path_, data, Module::LoadMode::Mmap, /*event_tracer=*/nullptr,
                                         /*memory_allocator=*/nullptr, /*temp_allocator=*/nullptr,
                                         /*share_memory_arenas=*/true);
    }
    // InternalConsistency: verify the whole flatbuffer, so a damaged file is refused here
    // rather than read out of bounds later.
    Error e = module_->load(executorch::runtime::Program::Verification::InternalConsistency);
    if (e != Error::Ok) {
      bad_input(path_ + (data.empty() ? "" : " with " + data) +
                " is not an ExecuTorch program this runtime can load (" + error_name(e) + ")");
    }
    auto names = module_->method_names();
    if (!names.ok()) bad_input(path_ + ": cannot list its methods (" + error_name(names.error()) + ")");
    names_ = *names;
  }

  // CPU or CUDA program (its methods are CudaBackend delegates), with the right files and a
  // runner that can run it; a CUDA program's backend is set up before any method loads.
  void check_backend(const std::string& data, bool shared_state, bool cuda_graphs) {
    for (const char* name : {"target_prefill", "target_verify"}) {
      if (!names_.count(name)) continue;  // check_methods says so
      auto meta = module_->method_meta(name);
      cuda_ = cuda_ || (meta.ok() && meta->uses_backend("CudaBackend"));
    }
    if (cuda_ && executorch::runtime::get_backend_class("CudaBackend") == nullptr) {
      bad_input(path_ + " is a CUDA program (its methods are CudaBackend delegates), and this runner was built " +
                "without ExecuTorch's CUDA backend: build it with scripts/build-cuda-runner.sh");
    }
    if (cuda_ && data.empty()) {
      bad_input(path_ + " is a CUDA program: give --data with the aoti_cuda_blob.ptd that `dflash-et export` " +
                "wrote beside it (its compiled methods and weights)");
    }
    if (!cuda_ && !data.empty()) {
      bad_input(path_ + " is a CPU program (no CudaBackend delegate) and has no .ptd: run it without --data " + data);
    }
    if (!cuda_) {
      if (!shared_state) bad_input("--no-shared-state is for CUDA programs");
      if (cuda_graphs) bad_input("--cuda-graphs is for CUDA programs: " + path_ + " is a CPU program");
      return;
    }
    check_data_belongs(path_, data);
#ifdef DFLASH_RUNNER_CUDA
    // One stream for every method (each waits for the state the previous one wrote), and the
    // outputs of the methods that return `hidden` left on the GPU (we copy their ids out).
    // --cuda-graphs: cuda/executorch-v1.2.0-cuda-graphs.patch (the methods loaded while it is set).
    executorch::runtime::BackendOptions<3> global;
    global.set_option("use_shared_cuda_stream", true);
    global.set_option("skip_copy_output_to_cpu_for_method", "target_prefill,target_verify");
    global.set_option("dflash_cuda_graphs", cuda_graphs);
    Error e = executorch::runtime::set_option("CudaBackend", global.view());
    if (e != Error::Ok) failed("setting the CUDA backend's options failed (" + error_name(e) + ")");
    keep_pool_memory();
    if (shared_state) {  // a group of this program alone: another program's constants never mix in
      char group[64];
      std::snprintf(group, sizeof group, "dflash_runner:%p", static_cast<void*>(this));
      share_group_.set_option("share_constants_group", group);
      load_options_.set_options("CudaBackend", share_group_.view());
    }
#endif
  }

#ifdef DFLASH_RUNNER_CUDA
  // The backend allocates every call's outputs and intermediates (a verify's logits: rows x
  // vocab, hundreds of MB) with cudaMallocAsync from the device's default pool, and that pool
  // hands memory beyond its release threshold (default 0) back to the driver at each
  // synchronisation: each call would map its memory again. Keep it (as PyTorch's caching
  // allocator does); a runner that cannot only warns, since results do not depend on it.
  static void keep_pool_memory() {
    int device = 0;
    cudaMemPool_t pool = nullptr;
    uint64_t keep = UINT64_MAX;
    cudaError_t e = cudaGetDevice(&device);
    if (e == cudaSuccess) e = cudaDeviceGetDefaultMemPool(&pool, device);
    if (e == cudaSuccess) e = cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep);
    if (e != cudaSuccess) {
      std::fprintf(stderr, "dflash_runner: warning: the CUDA memory pool will release its memory at each "
                   "synchronisation (%s): calls may be slower\n", cudaGetErrorString(e));
      cudaGetLastError();
    }
  }

  // The AOTInductor shims a method's compiled library (`<method>_so_blob` in the .ptd) calls
  // that this runner does not define (cuda/shim_check.h): a warning that names them before the
  // methods load, since such a method fails only when it runs, with libtorch's function in the
  // stack. (Not an error: a library may import a shim that no path of it calls.)
  void warn_missing_shims(const std::string& data) {
    auto loader = executorch::extension::FileDataLoader::from(data.c_str());
    if (!loader.ok()) return;  // check_data_belongs has read the file; load_method reports the rest
    auto map = executorch::extension::FlatTensorDataMap::load(&loader.get());
    if (!map.ok()) return;
    for (const std::string& method : names_) {
      auto library = map->get_data(method + "_so_blob");
      if (!library.ok()) continue;  // a constant method: no compiled code
      std::string error;
      const auto imports = dflash::undefined_symbols(static_cast<const uint8_t*>(library->data()), library->size(),
                                                     "aoti_", error);
      if (!error.empty()) {
        std::fprintf(stderr, "dflash_runner: warning: %s_so_blob in %s: %s\n", method.c_str(), data.c_str(),
                     error.c_str());
        continue;
      }
      std::string missing;
      for (const std::string& name : dflash::not_in_executable(imports)) missing += (missing.empty() ? "" : ", ") + name;
      if (!missing.empty()) {
        std::fprintf(stderr,
                     "dflash_runner: warning: method '%s' calls AOTInductor shims that this runner does not define: "
                     "%s. ExecuTorch 1.2.0's CUDA backend lacks them, and libtorch's, which cannot read its tensors, "
                     "would answer; if the method fails, add them beside cuda/zero_shim.cpp\n",
                     method.c_str(), missing.c_str());
      }
    }
  }
#endif

  Error load_method(const std::string& name) {
#ifdef DFLASH_RUNNER_CUDA
    if (cuda_) return module_->load_method(name, nullptr, nullptr, &load_options_);
#endif
    return module_->load_method(name);
  }

  // The four model methods with the inputs / outputs of the contract, loaded (a kernel
  // this runtime did not register shows here).
  void check_methods() {
    const ScalarType L = ScalarType::Long, F = ScalarType::Float, H = hidden_dtype;
    std::vector<ScalarType> rows_in = {L, L, L, L};
    if (sampling()) rows_in.insert(rows_in.end(), {F, L, F, L});
    struct Signature {
      const char* name;
      std::vector<ScalarType> inputs, outputs;
    };
    const Signature signatures[] = {
        {"target_prefill", rows_in, {L, H}},
        {"draft_prefill", {H, L, L, L}, {L}},
        {"draft_forward", {H, L, L, L, L, L}, {L}},
        {"target_verify", rows_in, {L, L, H}},
    };
    for (const Signature& s : signatures) {
      const std::string name = s.name;
      if (!names_.count(name)) bad_input(path_ + " has no method '" + name + "' (docs/CONTRACT.md)");
      auto meta = module_->method_meta(name);
      if (!meta.ok()) bad_input(path_ + ": no metadata for '" + name + "' (" + error_name(meta.error()) + ")");
      auto matches = [&](size_t count, auto tensor_meta, const std::vector<ScalarType>& want) {
        if (count != want.size()) return false;
        for (size_t i = 0; i < count; ++i) {
          auto t = tensor_meta(i);
          if (!t.ok() || t->scalar_type() != want[i]) return false;
        }
        return true;
      };
      bool inputs_ok = matches(meta->num_inputs(), [&](size_t i) { return meta->input_tensor_meta(i); }, s.inputs);
      bool outputs_ok = matches(meta->num_outputs(), [&](size_t i) { return meta->output_tensor_meta(i); }, s.outputs);
      if (!inputs_ok || !outputs_ok) {
        bad_input(path_ + ": method '" + name + "' does not have the " + variant + " variant's " +
                  std::to_string(s.inputs.size()) + " inputs / " + std::to_string(s.outputs.size()) +
                  " outputs of contract_version " + std::to_string(kContractVersion) + " (docs/CONTRACT.md)");
      }
      Error e = load_method(name);
      if (e != Error::Ok) {
        failed("loading method '" + name + "' of " + path_ + " failed (" + error_name(e) + ")" +
               (e == Error::OperatorMissing ? ": a kernel it needs is not registered; link executorch::kernels_optimized"
                                            : ""));
      }
    }
  }

  std::string path_;
  bool timing_ = false;
  bool cuda_ = false;
  std::unique_ptr<Module> module_;  // Module can be neither copied nor moved
  std::unordered_set<std::string> names_;
#ifdef DFLASH_RUNNER_CUDA
  // Must outlive the loaded methods (LoadBackendOptionsMap keeps a view of the options).
  executorch::runtime::BackendOptions<1> share_group_;
  executorch::runtime::LoadBackendOptionsMap load_options_;
#endif
};

// ---------------------------------------------------------------------------------
// Tensors in and out: only int64 ids and counts are read; hidden is copied as bytes (CPU)
// or handed on where it lies (CUDA)

bool on_gpu(const void* data) {
#ifdef DFLASH_RUNNER_CUDA
  cudaPointerAttributes attributes{};
  if (data != nullptr && cudaPointerGetAttributes(&attributes, data) == cudaSuccess) {
    return attributes.type == cudaMemoryTypeDevice;
  }
  cudaGetLastError();  // a host pointer may leave "invalid value" behind: clear it
#else
  (void)data;
#endif
  return false;
}

void copy_to_host(void* dst, const void* src, size_t nbytes) {
#ifdef DFLASH_RUNNER_CUDA
  if (on_gpu(src)) {
    // The legacy default stream waits for the backend's (blocking) stream: the method is done.
    cudaError_t e = cudaMemcpy(dst, src, nbytes, cudaMemcpyDeviceToHost);
    if (e != cudaSuccess) failed(std::string("copying an output from the GPU failed: ") + cudaGetErrorString(e));
    return;
  }
#endif
  std::memcpy(dst, src, nbytes);
}

TensorPtr longs(std::vector<int64_t> values) {
  const auto n = static_cast<SizesType>(values.size());
  return make_tensor_ptr({n}, std::move(values));
}

TensorPtr floats(const std::vector<double>& values) {
  std::vector<float> data(values.begin(), values.end());  // the float32 cast of the reference
  const auto n = static_cast<SizesType>(data.size());
  return make_tensor_ptr({n}, std::move(data));
}

TensorPtr offsets_of(const std::vector<int64_t>& counts) {  // cu_seqlens: [O+1]
  std::vector<int64_t> out = {0};
  for (int64_t c : counts) out.push_back(out.back() + c);
  return longs(std::move(out));
}

// An int64 output with `numel` elements, copied out.
std::vector<int64_t> read_ints(const EValue& v, const std::string& what, size_t numel) {
  if (!v.isTensor() || v.toTensor().scalar_type() != ScalarType::Long ||
      static_cast<size_t>(v.toTensor().numel()) != numel) {
    failed(what + " is not an int64 tensor of " + std::to_string(numel) + " elements");
  }
  std::vector<int64_t> out(numel);
  copy_to_host(out.data(), v.toTensor().const_data_ptr(), numel * sizeof(int64_t));
  return out;
}

// A hidden output [rows, F] for the next method: copied, byte for byte, into a runner-owned
// tensor; or, on the GPU, a view of the backend's output buffer, which stays valid until the
// method that wrote it runs again (target_verify's hidden feeds the next draft_forward,
// target_prefill's the draft_prefill right after it).
TensorPtr keep_hidden(const DFlashProgram& program, const EValue& v, const std::string& what, int64_t rows) {
  if (!v.isTensor()) failed(what + " is not a tensor");
  const Tensor& t = v.toTensor();
  if (t.scalar_type() != program.hidden_dtype || t.dim() != 2 || t.size(0) != rows ||
      t.size(1) != program.hidden_width) {
    failed(what + " is not a [" + std::to_string(rows) + ", " + std::to_string(program.hidden_width) + "] " +
           program.model_dtype + " tensor");
  }
  const std::vector<SizesType> sizes = {static_cast<SizesType>(rows), static_cast<SizesType>(program.hidden_width)};
  if (on_gpu(t.const_data_ptr())) return make_tensor_ptr(sizes, t.mutable_data_ptr(), program.hidden_dtype);
  const auto* p = t.const_data_ptr<uint8_t>();
  std::vector<uint8_t> bytes(p, p + t.nbytes());
  return make_tensor_ptr(sizes, std::move(bytes), program.hidden_dtype);
}

TensorPtr zero_hidden(const DFlashProgram& program) {  // [1, F]: no target_verify yet
  std::vector<uint8_t> bytes(program.hidden_width * executorch::runtime::elementSize(program.hidden_dtype), 0);
  return make_tensor_ptr({1, static_cast<SizesType>(program.hidden_width)}, std::move(bytes), program.hidden_dtype);
}

// ---------------------------------------------------------------------------------
// The loop (export/driver.py: generate, prefill, _admit, _release, _draft, _verify_and_commit)

struct Owner {
  size_t index = 0;
  OwnerOptions options;
  // loop state
  int64_t slot = -1;
  std::vector<int64_t> generated;  // committed after the prompt; back() is pending
  int64_t position = 0;            // position of the pending token
  int64_t hidden_start = 0;        // its first row in the last target_verify's hidden
  int64_t committed = 0;           // rows of that hidden to append to the drafter's context
  // statistics
  int64_t verifies = 0;             // target_verify calls that covered this owner
  int64_t verified_committed = 0;   // the sum of their accepted + 1

  bool done() const { return static_cast<int64_t>(generated.size()) >= options.max_new; }
};

struct Step {
  size_t owners = 0;
  int64_t tokens = 0;
  std::vector<int64_t> acceptance;           // accepted + 1 per verified owner
  std::vector<std::vector<int64_t>> drafts;  // draft_forward's drafts per verified owner
};

void check_owners(const DFlashProgram& p, const std::vector<OwnerOptions>& owners) {
  if (static_cast<int64_t>(owners.size()) > p.max_owners) {
    bad_input(std::to_string(owners.size()) + " owners given; " + p.path() + " serves at most max_owners = " +
              std::to_string(p.max_owners) + " (its KV slots); give fewer --owner options");
  }
  if (static_cast<int64_t>(owners.size()) > p.max_rows) {  // every verified owner needs a row
    bad_input(std::to_string(owners.size()) + " owners given; " + p.path() + " verifies at most max_rows = " +
              std::to_string(p.max_rows) + " rows a call; give fewer --owner options");
  }
  for (size_t i = 0; i < owners.size(); ++i) {
    const OwnerOptions& o = owners[i];
    const std::string who = "owner " + std::to_string(i);
    const int64_t n = static_cast<int64_t>(o.prompt.size());
    if (o.max_new > p.max_seq_len - n) {  // n + max_new > max_seq_len, without overflow
      bad_input(who + ": prompt (" + std::to_string(n) + ") + max_new (" + std::to_string(o.max_new) +
                ") exceeds the program's max_seq_len (" + std::to_string(p.max_seq_len) +
                "); shorten one or export with a larger limits.max_seq_len");
    }
    for (int64_t t : o.prompt) {
      if (t < 0 || t >= p.vocab_size) {
        bad_input(who + ": prompt token " + std::to_string(t) + " is outside the vocab [0, " +
                  std::to_string(p.vocab_size) + ")");
      }
    }
    if (!p.sampling() && o.temperature > 0) {
      bad_input(who + " asks for temperature " + num(o.temperature) +
                "; a greedy program only decodes greedily (give temperature=0 or a sampling program)");
    }
  }
}

// The variant's sampling inputs of `owners` (none for the greedy variant).
std::vector<TensorPtr> sampling_inputs(const DFlashProgram& p, const std::vector<Owner*>& owners) {
  if (!p.sampling()) return {};
  std::vector<double> temperature, top_p;
  std::vector<int64_t> top_k, seed;
  for (const Owner* o : owners) {
    temperature.push_back(o->options.temperature);
    top_k.push_back(o->options.top_k);
    top_p.push_back(o->options.top_p);
    seed.push_back(o->options.seed);
  }
  return {floats(temperature), longs(top_k), floats(top_p), longs(seed)};
}

// Prompts of the joining owners, in calls of at most max_rows rows and max_owners owners.
void prefill(DFlashProgram& p, const std::vector<Owner*>& joiners, bool speculative) {
  std::vector<int64_t> done(joiners.size(), 0);
  auto left = [&](size_t i) { return static_cast<int64_t>(joiners[i]->options.prompt.size()) - done[i]; };
  while (true) {
    bool any = false;
    for (size_t i = 0; i < joiners.size(); ++i) any |= left(i) > 0;
    if (!any) return;
    std::vector<size_t> batch;  // indices into joiners
    std::vector<int64_t> counts;
    for (size_t i = 0; i < joiners.size(); ++i) {
      const int64_t room = p.max_rows - std::accumulate(counts.begin(), counts.end(), int64_t{0});
      if (left(i) > 0 && room > 0 && static_cast<int64_t>(batch.size()) < p.max_owners) {
        batch.push_back(i);
        counts.push_back(std::min(left(i), room));
      }
    }
    std::vector<int64_t> tokens, starts, slots;
    std::vector<Owner*> owners;
    for (size_t b = 0; b < batch.size(); ++b) {
      const Owner* o = joiners[batch[b]];
      const auto& prompt = o->options.prompt;
      const int64_t s = done[batch[b]];
      tokens.insert(tokens.end(), prompt.begin() + s, prompt.begin() + s + counts[b]);
      starts.push_back(s);
      slots.push_back(o->slot);
      owners.push_back(joiners[batch[b]]);
    }
    const int64_t rows = static_cast<int64_t>(tokens.size());
    const TensorPtr offsets = offsets_of(counts), start_position = longs(starts), slot_ids = longs(slots);
    std::vector<TensorPtr> inputs = {longs(tokens), offsets, start_position, slot_ids};
    for (TensorPtr& t : sampling_inputs(p, owners)) inputs.push_back(std::move(t));
    auto out = p.call("target_prefill", inputs, 2);
    const std::vector<int64_t> first = read_ints(out[0], "target_prefill first_token", batch.size());
    const TensorPtr hidden = keep_hidden(p, out[1], "target_prefill hidden", rows);
    if (speculative) {
      auto stored_out = p.call("draft_prefill", {hidden, offsets, start_position, slot_ids}, 1);
      const std::vector<int64_t> stored = read_ints(stored_out[0], "draft_prefill stored", batch.size());
      if (stored != counts) failed("draft_prefill stored [" + join(stored) + "] rows, expected [" + join(counts) + "]");
    }
    for (size_t b = 0; b < batch.size(); ++b) {
      Owner* o = joiners[batch[b]];
      done[batch[b]] += counts[b];
      if (left(batch[b]) == 0) {  // the last chunk decides the first token
        if (first[b] < 0) failed("target_prefill gave no first token for owner " + std::to_string(o->index));
        o->generated = {first[b]};
        o->position = static_cast<int64_t>(o->options.prompt.size());
        o->committed = 0;
      }
    }
  }
}

// Rows to verify per owner: the pending token plus as many drafts as the block, the
// owner's budget and the call's row bound allow.
std::vector<int64_t> rows_per_owner(const DFlashProgram& p, const std::vector<Owner*>& active, bool speculative) {
  std::vector<int64_t> n;
  for (const Owner* o : active) {
    n.push_back(std::min<int64_t>(speculative ? p.block_size : 1,
                                  o->options.max_new - static_cast<int64_t>(o->generated.size())));
  }
  while (std::accumulate(n.begin(), n.end(), int64_t{0}) > p.max_rows) --*std::max_element(n.begin(), n.end());
  return n;
}

// Owners whose join step has come, while slots and the owner bound allow; each takes
// the lowest free slot (so a departed owner's slot is reused).
std::vector<Owner*> admit(std::vector<Owner*>& waiting, const std::vector<Owner*>& active, std::vector<int64_t>& free,
                          int64_t step, int64_t max_owners) {
  std::vector<Owner*> joiners;
  while (!waiting.empty() && waiting.front()->options.join <= step && !free.empty() &&
         static_cast<int64_t>(active.size() + joiners.size()) < max_owners) {
    Owner* o = waiting.front();
    waiting.erase(waiting.begin());
    auto lowest = std::min_element(free.begin(), free.end());
    o->slot = *lowest;
    free.erase(lowest);
    joiners.push_back(o);
  }
  return joiners;
}

template <typename Leaving>
void release(std::vector<Owner*>& active, std::vector<int64_t>& free, Leaving leaving) {
  for (const Owner* o : active) {
    if (leaving(*o)) free.push_back(o->slot);
  }
  active.erase(std::remove_if(active.begin(), active.end(), [&](const Owner* o) { return leaving(*o); }),
               active.end());
}

// One draft_forward for every active owner: its committed rows of the last verify's
// `hidden` (none for a joiner) become context, then block_size - 1 drafts each.
std::vector<std::vector<int64_t>> draft(DFlashProgram& p, const std::vector<Owner*>& active, const TensorPtr& hidden) {
  std::vector<int64_t> hidden_start, committed, pending, position, slots;
  for (const Owner* o : active) {
    hidden_start.push_back(o->hidden_start);
    committed.push_back(o->committed);
    pending.push_back(o->generated.back());
    position.push_back(o->position);
    slots.push_back(o->slot);
  }
  auto out = p.call("draft_forward",
                    {hidden, longs(hidden_start), longs(committed), longs(pending), longs(position), longs(slots)}, 1);
  const size_t width = static_cast<size_t>(p.block_size - 1);
  const std::vector<int64_t> flat = read_ints(out[0], "draft_forward drafts", active.size() * width);  // [O, B-1]
  std::vector<std::vector<int64_t>> drafts;
  for (size_t i = 0; i < active.size(); ++i) drafts.emplace_back(flat.begin() + i * width, flat.begin() + (i + 1) * width);
  return drafts;
}

// target_verify over each owner's [pending, drafts...]; commits the accepted drafts and
// next_token. Returns accepted + 1 per owner; `hidden` becomes a copy of its hidden rows.
std::vector<int64_t> verify_and_commit(DFlashProgram& p, const std::vector<Owner*>& active,
                                       const std::vector<std::vector<int64_t>>& rows, TensorPtr& hidden) {
  std::vector<int64_t> n, tokens, position, slots;
  for (size_t i = 0; i < active.size(); ++i) {
    n.push_back(static_cast<int64_t>(rows[i].size()));
    tokens.insert(tokens.end(), rows[i].begin(), rows[i].end());
    position.push_back(active[i]->position);
    slots.push_back(active[i]->slot);
  }
  std::vector<TensorPtr> inputs = {longs(tokens), offsets_of(n), longs(position), longs(slots)};
  for (TensorPtr& t : sampling_inputs(p, active)) inputs.push_back(std::move(t));
  auto out = p.call("target_verify", inputs, 3);
  const std::vector<int64_t> accepted = read_ints(out[0], "target_verify accepted", active.size());
  const std::vector<int64_t> next_token = read_ints(out[1], "target_verify next_token", active.size());
  hidden = keep_hidden(p, out[2], "target_verify hidden", static_cast<int64_t>(tokens.size()));
  std::vector<int64_t> lengths;
  int64_t offset = 0;
  for (size_t i = 0; i < active.size(); ++i) {
    Owner* o = active[i];
    const int64_t a = accepted[i];
    if (next_token[i] < 0 || next_token[i] >= p.vocab_size || a < 0 || a >= n[i]) {
      failed("target_verify gave accepted " + std::to_string(a) + ", next_token " + std::to_string(next_token[i]) +
             " for owner " + std::to_string(o->index) + " with " + std::to_string(n[i]) + " rows");
    }
    o->generated.insert(o->generated.end(), rows[i].begin() + 1, rows[i].begin() + 1 + a);
    o->generated.push_back(next_token[i]);
    o->hidden_start = offset;
    o->committed = a + 1;
    o->position += a + 1;
    o->verifies += 1;
    o->verified_committed += a + 1;
    lengths.push_back(a + 1);
    offset += n[i];
  }
  return lengths;
}

// --profile-steps: the CUDA profiler's capture range, opened or closed (a CUDA runner only: run()
// refuses the option elsewhere).
void profile_range(bool open) {
#ifdef DFLASH_RUNNER_CUDA
  const cudaError_t e = open ? cudaProfilerStart() : cudaProfilerStop();
  if (e != cudaSuccess) {
    failed(std::string(open ? "cudaProfilerStart" : "cudaProfilerStop") + " failed: " + cudaGetErrorString(e));
  }
#else
  (void)open;
#endif
}

// Runs the loop until every owner is done or has left.
std::vector<Step> generate(DFlashProgram& p, std::vector<Owner>& owners, bool speculative, bool profile_steps) {
  std::vector<Owner*> waiting;
  for (Owner& o : owners) waiting.push_back(&o);
  std::stable_sort(waiting.begin(), waiting.end(),
                   [](const Owner* a, const Owner* b) { return a->options.join < b->options.join; });
  std::vector<Owner*> active;
  std::vector<int64_t> free(p.max_owners);
  std::iota(free.begin(), free.end(), int64_t{0});
  TensorPtr hidden = zero_hidden(p);
  std::vector<Step> steps;
  while (!waiting.empty() || !active.empty()) {
    const int64_t step = static_cast<int64_t>(steps.size());
    release(active, free, [&](const Owner& o) { return o.options.leave >= 0 && o.options.leave <= step; });
    std::vector<Owner*> joiners = admit(waiting, active, free, step, p.max_owners);
    if (!joiners.empty()) prefill(p, joiners, speculative);
    active.insert(active.end(), joiners.begin(), joiners.end());
    release(active, free, [](const Owner& o) { return o.done(); });
    if (active.empty()) {
      steps.push_back(Step{});
      continue;
    }
    if (profile_steps) profile_range(true);
    const auto step_start = std::chrono::steady_clock::now();
    std::vector<std::vector<int64_t>> drafts =
        speculative ? draft(p, active, hidden) : std::vector<std::vector<int64_t>>(active.size());
    const std::vector<int64_t> n = rows_per_owner(p, active, speculative);
    std::vector<std::vector<int64_t>> rows;
    for (size_t i = 0; i < active.size(); ++i) {
      if (n[i] < 1) failed("no row left for owner " + std::to_string(active[i]->index) + " (max_rows too small)");
      std::vector<int64_t> r = {active[i]->generated.back()};
      r.insert(r.end(), drafts[i].begin(), drafts[i].begin() + std::min<int64_t>(n[i] - 1, drafts[i].size()));
      rows.push_back(std::move(r));
    }
    Step s;
    s.owners = active.size();
    s.acceptance = verify_and_commit(p, active, rows, hidden);
    if (profile_steps) profile_range(false);
    if (p.timing()) {
      p.times["step"].push_back(
          std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - step_start).count());
    }
    s.tokens = std::accumulate(s.acceptance.begin(), s.acceptance.end(), int64_t{0});
    s.drafts = std::move(drafts);
    steps.push_back(std::move(s));
  }
  return steps;
}

// ---------------------------------------------------------------------------------
// Report

std::string describe(const OwnerOptions& o) {
  char rule[160];
  if (o.temperature <= 0) {
    std::snprintf(rule, sizeof rule, "greedy");
  } else {
    std::snprintf(rule, sizeof rule, "temperature %g top_k %lld top_p %g seed %lld", o.temperature,
                  static_cast<long long>(o.top_k), o.top_p, static_cast<long long>(o.seed));
  }
  std::string out = "prompt " + std::to_string(o.prompt.size()) + " tokens, max_new " + std::to_string(o.max_new) +
                    ", " + rule + ", joins at step " + std::to_string(o.join);
  if (o.leave >= 0) out += ", leaves before step " + std::to_string(o.leave);
  return out;
}

void report(const DFlashProgram& p, const std::vector<Owner>& owners, const std::vector<Step>& steps,
            bool print_drafts) {
  std::printf("constants get_contract_version=%lld get_program=%s get_variant=%s get_model_dtype=%s "
              "get_vocab_size=%lld get_hidden_size=%lld get_n_target_layers=%lld get_hidden_width=%lld "
              "get_target_layer_ids=%s get_block_size=%lld get_mask_token_id=%lld get_max_rows=%lld "
              "get_max_owners=%lld get_max_seq_len=%lld\n",
              static_cast<long long>(p.contract_version), p.program.c_str(), p.variant.c_str(), p.model_dtype.c_str(),
              static_cast<long long>(p.vocab_size), static_cast<long long>(p.hidden_size),
              static_cast<long long>(p.num_target_layers), static_cast<long long>(p.hidden_width),
              join(p.target_layer_ids, ",").c_str(), static_cast<long long>(p.block_size),
              static_cast<long long>(p.mask_token_id), static_cast<long long>(p.max_rows),
              static_cast<long long>(p.max_owners), static_cast<long long>(p.max_seq_len));
  for (const Owner& o : owners) std::printf("owner %zu: %s\n", o.index, describe(o.options).c_str());
  for (size_t i = 0; i < steps.size(); ++i) {
    const Step& s = steps[i];
    std::printf("step %zu owners %zu tokens %lld acceptance %s\n", i, s.owners, static_cast<long long>(s.tokens),
                s.acceptance.empty() ? "-" : join(s.acceptance).c_str());
    if (print_drafts && s.owners > 0) {
      std::string text;
      for (const auto& d : s.drafts) text += " " + (d.empty() ? std::string("-") : join(d, ","));
      std::printf("step %zu drafts%s\n", i, text.c_str());
    }
  }
  int64_t verifies = 0, committed = 0, busy = 0;
  for (const Owner& o : owners) {
    std::printf("owner %zu tokens: %s\n", o.index, join(o.generated).c_str());
    std::printf("owner %zu stats: verifies %lld committed %lld mean_acceptance %.4f\n", o.index,
                static_cast<long long>(o.verifies), static_cast<long long>(o.verified_committed),
                o.verifies ? static_cast<double>(o.verified_committed) / o.verifies : 0.0);
    verifies += o.verifies;
    committed += o.verified_committed;
  }
  for (const Step& s : steps) busy += s.owners > 0;
  std::printf("total: steps %zu verifies %lld committed %lld mean_acceptance %.4f tokens_per_step %.4f\n", steps.size(),
              static_cast<long long>(verifies), static_cast<long long>(committed),
              verifies ? static_cast<double>(committed) / verifies : 0.0,
              busy ? static_cast<double>(committed) / busy : 0.0);
}

// --timing: per method (and per step), the median and mean of its calls; then the whole
// loop's committed tokens per second (every owner's tokens, the first ones included).
void report_timing(const DFlashProgram& p, const std::vector<Owner>& owners, double seconds) {
  for (const auto& [name, us] : p.times) {
    std::vector<double> sorted = us;
    std::sort(sorted.begin(), sorted.end());
    const size_t n = sorted.size();
    const double median = n % 2 ? sorted[n / 2] : (sorted[n / 2 - 1] + sorted[n / 2]) / 2;
    std::printf("timing %s calls %zu median_us %.1f mean_us %.1f\n", name.c_str(), n, median,
                std::accumulate(sorted.begin(), sorted.end(), 0.0) / n);
  }
  size_t committed = 0;
  for (const Owner& o : owners) committed += o.generated.size();
  std::printf("timing loop seconds %.4f committed %zu tokens_per_second %.1f\n", seconds, committed,
              seconds > 0 ? committed / seconds : 0.0);
}

int run(int argc, char** argv) {
  Options options;
  if (!parse_args(argc, argv, options)) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  DFlashProgram program(options.program, options.data, options.timing, options.shared_state, options.cuda_graphs);
  if (options.profile_steps && !program.cuda()) {
    bad_input("--profile-steps is for CUDA programs: " + options.program + " is a CPU program");
  }
  check_owners(program, options.owners);
  std::vector<Owner> owners(options.owners.size());
  for (size_t i = 0; i < owners.size(); ++i) {
    owners[i].index = i;
    owners[i].options = options.owners[i];
  }
  const auto start = std::chrono::steady_clock::now();
  const std::vector<Step> steps = generate(program, owners, !options.target_only, options.profile_steps);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  report(program, owners, steps, options.drafts);
  if (options.timing) report_timing(program, owners, seconds);
  if (options.cuda_graphs) {
    const auto [captured, replayed] = program.cuda_graphs();
    std::printf("cuda_graphs captured %d replayed %d\n", captured, replayed);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  executorch::runtime::register_pal(executorch::runtime::PalImpl::create(emit_runtime_log, __FILE__));
  try {
    return run(argc, argv);
  } catch (const Failure& f) {
    std::fflush(stdout);
    std::fprintf(stderr, "dflash_runner: error: %s\n", f.what());
    return f.code;
  } catch (const std::exception& e) {  // std::bad_alloc and the like
    std::fflush(stdout);
    std::fprintf(stderr, "dflash_runner: error: %s\n", e.what());
    return kExitFailed;
  }
}
