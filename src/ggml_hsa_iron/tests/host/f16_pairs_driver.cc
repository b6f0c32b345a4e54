// f16_pairs_driver.cc: ggml_aie.h's half_pairs_to_f32 on the host (test_f16_pairs_host.py).
// Reads 32-bit words (hex, two f16 values each: value 2i in word i's low half) from the file
// named by argv[1], VEC words per vector; writes each value's f32 bits (hex, one per line) in
// the values' order, the pair order undone.
#include "ggml_aie.h"

#include <cstdio>
#include <vector>

using namespace ggml_aie;

int main(int argc, char **argv) {
  if (argc != 2)
    return 2;
  FILE *f = std::fopen(argv[1], "r");
  if (!f)
    return 2;
  std::vector<uint32_t> words;
  unsigned w;
  while (std::fscanf(f, "%x", &w) == 1)
    words.push_back(w);
  std::fclose(f);
  if (words.size() % VEC)
    return 2;
  for (size_t i = 0; i < words.size(); i += VEC) {
    alignas(64) int32_t in[VEC];
    for (unsigned j = 0; j < VEC; ++j)
      in[j] = int32_t(words[i + j]);
    vf even, odd;
    half_pairs_to_f32(aie::load_v<VEC>(in), even, odd);
    for (unsigned j = 0; j < VEC; ++j)
      std::printf("%08x\n%08x\n", __builtin_bit_cast(uint32_t, even.get(j)),
                  __builtin_bit_cast(uint32_t, odd.get(j)));
  }
  return 0;
}
