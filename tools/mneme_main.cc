// mneme: the command-line tool (checkpoints, Engram tables, later the
// cluster). Each subcommand lives in tools/cli/.
#include <iostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "tools/cli/bench_engram_command.h"
#include "tools/cli/bench_serving_command.h"
#include "tools/cli/cast_experts_command.h"
#include "tools/cli/cluster_command.h"
#include "tools/cli/draft_command.h"
#include "tools/cli/engram_command.h"
#include "tools/cli/engram_service_command.h"
#include "tools/cli/generate_command.h"
#include "tools/cli/inspect_command.h"
#include "tools/cli/localize_command.h"
#include "tools/cli/make_checkpoint_command.h"
#include "tools/cli/plan_command.h"
#include "tools/cli/quantize_engram_command.h"
#include "tools/cli/run_command.h"
#include "tools/cli/tensor_command.h"

namespace {

constexpr char kUsage[] =
    "usage: mneme <command> [flags]\n"
    "\n"
    "commands:\n"
    "  make-checkpoint --out DIR [--engram-format fp8|nvfp4] [--seed N]\n"
    "                  [--engram-vocab-size N] [--threads N]\n"
    "                  [--wkv independent|correlated] [--expert-layers L,...]\n"
    "                  [--draft-stages N] [--experts N] [--hidden-size N]\n"
    "                  [--layers N] [--engram-layers L,...] [--hc-mult N]\n"
    "                  [--moe-intermediate-size N]\n"
    "      write a synthetic checkpoint of the Engram layers only (what the\n"
    "      engram store and the conversion tools read)\n"
    "  make-checkpoint --model [--arch v4-flash|v4.1-flash|v4-flash-0731]\n"
    "                  --out DIR [--full-shapes] [--seed N]\n"
    "                  [--engram-vocab-size N] [--engram-format fp8|nvfp4]\n"
    "                  [--threads N] [--aligned-draft]\n"
    "                  [--experts-format mxfp4|exl3|gridbook]\n"
    "      write a checkpoint of the released layout of that model (default\n"
    "      v4.1-flash; NVFP4 Engram tables for the tiny v4.1-flash): every\n"
    "      tensor, dtype and config key of the release, at tiny size with\n"
    "      healthy values, or with --full-shapes the release's exact config\n"
    "      and shapes as sparse files (headers real, data left as holes);\n"
    "      --aligned-draft: a tiny v4.1-flash whose DSpark drafter agrees\n"
    "      well with it (speculative decoding benchmarks); --experts-format:\n"
    "      the tiny model's experts as EXL3 trellises or a GridBook artifact\n"
    "  bench engram --checkpoint DIR --layer L [--io pread|uring] [--direct]\n"
    "               [--threads N] [--tokens-per-step N] [--steps N] [--json]\n"
    "      Engram lookups driven by a realistic token stream; rows/s, p50/p99\n"
    "  inspect DIR\n"
    "      the architecture, its layer types, draft stages, Engram layers,\n"
    "      expert format, the linear modules per storage format; tensors,\n"
    "      dtypes, shapes, shards and the Engram configuration\n"
    "  tensor --checkpoint DIR --name NAME --npy FILE [--threads N] [--json]\n"
    "      the linear weight NAME of any format (BF16, FP8, MXFP4, NVFP4,\n"
    "      EXL3, GridBook) dequantized to float32 [out, in] as a .npy file\n"
    "  plan --checkpoint DIR --tp N [--dcp N] --kv-cache-bytes B [--json]\n"
    "       [--kv-block-rows N] [--dcp-interleave N]\n"
    "      from config.json and the tensor headers only: weight bytes per\n"
    "      rank, KV bytes per token by layer type (the worker's fp32 pool and\n"
    "      the release's compact storage), fixed bytes per sequence, and the\n"
    "      KV pool in tokens and the longest sequence for B bytes per rank\n"
    "      (B like 6GiB)\n"
    "  engram lookup --server ADDR --layer L (--ids I0,... | --tokens T0,...\n"
    "                [--context N]) [--encoding bf16|fp32] [--stream]\n"
    "      rows from a running engram store, one line per row\n"
    "  bench engram-service --server ADDR --layer L [--streams N]\n"
    "                       [--duration-s S] [--tokens-per-step N]\n"
    "      closed-loop load on an engram store; JSON p50/p99, rows/s\n"
    "  engram describe --checkpoint DIR\n"
    "      JSON: per Engram layer rows, format, scale, multipliers, primes\n"
    "  engram ids --checkpoint DIR --layer L --tokens T0,T1,...\n"
    "      the row ids of every column for each position\n"
    "  engram rows --checkpoint DIR --layer L --ids I0,I1,...\n"
    "      the decoded fp32 values of rows\n"
    "  localize --checkpoint DIR --out DIR --tp N --rank R[,R...]\n"
    "           [--split strided|contiguous] [--threads N] [--force]\n"
    "      copy the Engram rows rank(s) R serve to a local directory\n"
    "  quantize-engram --checkpoint SRC --out DST\n"
    "                  [--method gptq-mse|gptq-amax|rtn-mse|rtn-amax]\n"
    "                  [--rows-per-step N] [--threads N] [--verify]\n"
    "      FP8 -> NVFP4 Engram tables into a new checkpoint, with a report\n"
    "  cast-experts --checkpoint SRC --out DST\n"
    "               (--calibration FILE.json | --uncalibrated) [--threads N]\n"
    "      lossless MXFP4 -> NVFP4 cast of the routed experts\n"
    "  run --checkpoint DIR --tokens T0,T1,... [--max-new-tokens N]\n"
    "      [--temperature X] [--top-p X] [--top-k N] [--min-p X] [--seed N]\n"
    "      [--chunk-tokens N] [--ignore-eos] [--threads N] [--json]\n"
    "      [--prompt-logprobs] [--logprobs N] [--dequantize-weights]\n"
    "      [--num-speculative-tokens K [--spec-method dspark]\n"
    "       [--spec-verify block|standard]]\n"
    "      generate with the whole model in this process (TP 1, CPU);\n"
    "      --prompt-logprobs adds prompt_logprobs (one number per prompt\n"
    "      position, null for the first), --logprobs N the top N of every\n"
    "      generated token (and of every prompt position)\n"
    "  draft --checkpoint DIR --tokens T0,T1,... [--chunk-tokens N]\n"
    "        [--threads N] [--json]\n"
    "      the target's greedy token after the prompt and the DSpark\n"
    "      drafter's greedy proposals after it (TP 1, CPU)\n"
    "  score --checkpoint A --reference B [--prompts FILE | --sequences N\n"
    "        --prompt-tokens P] [--completion-tokens C] [--seed N] [--json]\n"
    "      teacher-forced quality of A against B: logprobs, argmax, KL\n"
    "  generate --server ADDR (--tokens T0,T1,... | --prompt TEXT |\n"
    "           --chat-json FILE) [--stop S] [--max-new-tokens N]\n"
    "           [--temperature X] [--top-p X] [--top-k N] [--seed N]\n"
    "           [--stop-tokens S,...] [--ignore-eos] [--json]\n"
    "           [--api-key-file FILE]\n"
    "      stream a generation from a running coordinator (the API key of\n"
    "      --api-key-file, else of MNEME_API_KEY, when the coordinator has\n"
    "      one)\n"
    "  bench serving --server ADDR [--streams N] [--requests M]\n"
    "                [--prompt-tokens P] [--max-new-tokens K]\n"
    "      closed-loop load on a coordinator; JSON tokens/s, TTFT, ITL\n"
    "  cluster up [--checkpoint DIR] [--tp N] [--dcp N] [--chunk-tokens N]\n"
    "             [--workdir DIR] [--bin-dir DIR] [--kv-cache-bytes N]\n"
    "             [--max-num-seqs N] [--threads-per-worker N]\n"
    "             [--num-speculative-tokens K]\n"
    "             [--listen HOST:PORT] [--comm-timeout D] [--ready-timeout D]\n"
    "             [--coordinator-flags \"--flag=value ...\"] [--all-metrics]\n"
    "      a local cluster (engram store, workers, coordinator; the tiny\n"
    "      model without --checkpoint) until Ctrl-C; prints\n"
    "      `coordinator at HOST:PORT` and `http at HOST:PORT` (the OpenAI-\n"
    "      compatible API) when it is ready; --all-metrics gives the store\n"
    "      and the workers metrics endpoints too (printed with their "
    "address)\n";

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty() || args[0] == "help" || args[0] == "--help" ||
      args[0] == "-h") {
    std::cout << kUsage;
    return args.empty() ? 2 : 0;
  }
  const std::string command = args[0];
  const std::vector<std::string> rest(args.begin() + 1, args.end());
  absl::Status status;
  if (command == "make-checkpoint") {
    status = mneme::cli::RunMakeCheckpoint(rest, std::cout);
  } else if (command == "bench" && !rest.empty() &&
             rest[0] == "engram-service") {
    status = mneme::cli::RunBenchEngramService(
        std::vector<std::string>(rest.begin() + 1, rest.end()), std::cout);
  } else if (command == "bench" && !rest.empty() && rest[0] == "serving") {
    status = mneme::cli::RunBenchServing(
        std::vector<std::string>(rest.begin() + 1, rest.end()), std::cout);
  } else if (command == "bench") {
    status = mneme::cli::RunBenchEngram(rest, std::cout);
  } else if (command == "plan") {
    status = mneme::cli::RunPlan(rest, std::cout);
  } else if (command == "inspect") {
    status = mneme::cli::RunInspect(rest, std::cout);
  } else if (command == "tensor") {
    status = mneme::cli::RunTensor(rest, std::cout);
  } else if (command == "engram" && !rest.empty() && rest[0] == "lookup") {
    status = mneme::cli::RunEngramLookup(
        std::vector<std::string>(rest.begin() + 1, rest.end()), std::cout);
  } else if (command == "engram") {
    status = mneme::cli::RunEngramOffline(rest, std::cout);
  } else if (command == "quantize-engram") {
    status = mneme::cli::RunQuantizeEngram(rest, std::cout);
  } else if (command == "cast-experts") {
    status = mneme::cli::RunCastExperts(rest, std::cout);
  } else if (command == "run") {
    status = mneme::cli::RunRun(rest, std::cout);
  } else if (command == "draft") {
    status = mneme::cli::RunDraft(rest, std::cout);
  } else if (command == "generate") {
    status = mneme::cli::RunGenerate(rest, std::cout);
  } else if (command == "score") {
    status = mneme::cli::RunScore(rest, std::cout);
  } else if (command == "cluster") {
    status = mneme::cli::RunCluster(rest, std::cout, std::cerr);
  } else if (command == "localize") {
    status = mneme::cli::RunLocalize(rest, std::cout, std::cerr);
  } else {
    std::cerr << "mneme: error: unknown command '" << command
              << "' (mneme --help lists them)\n";
    return 2;
  }
  std::cout.flush();
  if (!status.ok()) {
    std::cerr << "mneme " << command << ": error: " << status.message() << "\n";
    return 1;
  }
  return 0;
}
