// cuda_backend_bench in a build without --config=cuda.

#include <cstdio>

int main() {
  std::printf("{\"skipped\": \"built without CUDA (--config=cuda)\"}\n");
  return 0;
}
