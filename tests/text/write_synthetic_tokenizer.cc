// Writes the synthetic tokenizer.json (tools/synthetic) to the file named by
// the first argument, for the reference test data (testdata/README.md).
#include <fstream>
#include <iostream>

#include "tools/synthetic/synthetic_tokenizer.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: write_synthetic_tokenizer OUTPUT.json\n";
    return 2;
  }
  std::ofstream out(argv[1], std::ios::binary);
  out << mneme::synthetic::SyntheticTokenizerJson();
  out.close();
  if (!out) {
    std::cerr << "cannot write " << argv[1] << "\n";
    return 1;
  }
  return 0;
}
