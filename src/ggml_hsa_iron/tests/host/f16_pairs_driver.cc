// f16_pairs_driver.cc: fa_rows.h's decode_f16_pairs (with ggml_aie.h's HalfPairs) on the
// host (test_f16_pairs_host.py). Reads 32-bit words (hex, two f16 values each: value 2i in
// word i's low half) from the file named by argv[1], rows of ROW values; writes each value's
// f32 bits (hex, one per line) in the values' order, the pair order undone.
#include "ggml_aie.h"

#include "fa_rows.h"

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
  constexpr int WORDS = ROW / 2;
  if (words.size() % WORDS)
    return 2;
  const HalfPairs halves;
  for (size_t i = 0; i < words.size(); i += WORDS) {
    alignas(64) int32_t in[WORDS];
    alignas(64) float out[ROW];
    for (int j = 0; j < WORDS; ++j)
      in[j] = int32_t(words[i + j]);
    fa_rows::decode_f16_pairs<ROW>(halves, in, out);
    for (int v = 0; v < ROW; ++v)
      std::printf("%08x\n", __builtin_bit_cast(uint32_t, out[HalfPairs::slot(v)]));
  }
  return 0;
}
