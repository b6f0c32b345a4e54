// Greedy generation with llama.cpp's public API, for the end-to-end tests (tests/llama_e2e.rs):
// decodes the prompt in one batch, then generates N tokens one at a time, and writes
//   stdout:  "prompt_tokens: <n>", "tokens: <id> <id> ..." and "text: <generated text>"
//   --logits FILE: the logits of every step (n_predict x n_vocab little-endian f32)
// All of llama.cpp's and ggml's log lines (debug level included, so GGML_SCHED_DEBUG output
// too) go to stderr.
//
// With --force ID,ID,... the given tokens are fed back instead of the argmax (teacher forcing:
// another run's tokens, so that both runs see the same sequence); "tokens:" still lists the
// argmax of every step.
//
// With --batch N (and --force covering every step) the forced tokens after the prompt are decoded
// N at a time, each batch's logits read at every position, as a speculative draft's
// verification batch is: the same logits as one token at a time, from kernels over N tokens.
//
// With --seqs S, S sequences decode side by side: sequence s's prompt is the prompt's first
// n - s tokens (its own positions and cache cells), the prompts are one batch, then every step is
// one batch of one token of each, as llama-parallel's and llama-server's slots decode. "tokens:",
// the logits file and --force go step by step, the sequences in order within a step; "text:" is
// sequence 0's. --kv-unified puts the sequences in one KV cache (llama.cpp's --kv-unified), told
// apart by the attention's mask; by default each has its own.
//
// With --rpc HOST:PORT[,HOST:PORT...] the model's devices are the RPC servers' (ggml's RPC
// backend, as llama.cpp's --rpc registers them); -ts A,B,... splits the layers between them as
// llama.cpp's -ts does. stdout then also has "gen_seconds: <s>", the wall time of the
// one-token steps (all but the first, which decodes the prompt).
//
// With --ignore-sigpipe the process ignores SIGPIPE, as servers and many applications do:
// ggml-rpc sends without MSG_NOSIGNAL, so a program that does not ignore it dies silently of
// SIGPIPE when its server goes away while it is sending; one that does gets ggml-rpc's error.
//
//   llama_greedy -m MODEL [-n N] [-ngl N] [-nkvo] [--logits FILE] [--force IDS] [--batch N]
//                [--seqs S [--kv-unified]] [--backend-dir DIR] [--rpc SERVERS] [-ts SPLIT]
//                [--ignore-sigpipe] PROMPT
// (DIR: where ggml looks for its backend libraries; default: next to the executable)
#include "llama.h"

#include <algorithm>
#include <chrono>
#include <clocale>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

static void log_all(enum ggml_log_level, const char * text, void *) {
    fputs(text, stderr);
}

int main(int argc, char ** argv) {
    std::setlocale(LC_NUMERIC, "C");
    std::string model_path, logits_path, backend_dir, prompt;
    int n_predict = 16;
    int n_verify = 1;
    int n_seqs = 1;
    bool kv_unified = false;
    std::vector<llama_token> forced;
    int ngl = 99;
    bool offload_kqv = true;
    std::string rpc_servers;
    std::vector<float> split;
    for (int i = 1; i < argc; ++i) {
        std::string a = argv[i];
        if (a == "-m" && i + 1 < argc) {
            model_path = argv[++i];
        } else if (a == "-n" && i + 1 < argc) {
            n_predict = std::atoi(argv[++i]);
        } else if (a == "--seqs" && i + 1 < argc) {
            n_seqs = std::atoi(argv[++i]);
        } else if (a == "--kv-unified") {
            kv_unified = true;
        } else if (a == "--batch" && i + 1 < argc) {
            n_verify = std::atoi(argv[++i]);
        } else if (a == "-ngl" && i + 1 < argc) {
            ngl = std::atoi(argv[++i]);
        } else if (a == "--force" && i + 1 < argc) {
            for (const char * p = argv[++i]; *p;) {
                char * end = nullptr;
                forced.push_back((llama_token) std::strtol(p, &end, 10));
                if (end == p) {
                    fprintf(stderr, "error: --force takes comma-separated token ids\n");
                    return 2;
                }
                p = *end == ',' ? end + 1 : end;
            }
        } else if (a == "--backend-dir" && i + 1 < argc) {
            backend_dir = argv[++i];
        } else if (a == "--rpc" && i + 1 < argc) {
            rpc_servers = argv[++i];
        } else if (a == "-ts" && i + 1 < argc) {
            for (const char * p = argv[++i]; *p;) {
                char * end = nullptr;
                split.push_back(std::strtof(p, &end));
                if (end == p) {
                    fprintf(stderr, "error: -ts takes comma-separated proportions\n");
                    return 2;
                }
                p = *end == ',' ? end + 1 : end;
            }
        } else if (a == "-nkvo") {
            offload_kqv = false;
        } else if (a == "--ignore-sigpipe") {
            std::signal(SIGPIPE, SIG_IGN);
        } else if (a == "--logits" && i + 1 < argc) {
            logits_path = argv[++i];
        } else {
            prompt += (prompt.empty() ? "" : " ") + a;
        }
    }
    if (model_path.empty() || prompt.empty() || n_predict < 1) {
        fprintf(stderr, "usage: %s -m MODEL [-n N] [-ngl N] [--logits FILE] [--backend-dir DIR] PROMPT\n", argv[0]);
        return 2;
    }
    if (n_verify < 1 || (n_verify > 1 && (int) forced.size() < n_predict - 1)) {
        fprintf(stderr, "error: --batch N takes N >= 1, and --force of every step's token when N > 1\n");
        return 2;
    }
    if (n_seqs < 1 || (n_seqs > 1 && n_verify > 1)) {
        fprintf(stderr, "error: --seqs S takes S >= 1, and no --batch\n");
        return 2;
    }

    llama_log_set(log_all, nullptr);
    ggml_backend_load_all_from_path(backend_dir.empty() ? nullptr : backend_dir.c_str());
    llama_backend_init();

    // The RPC servers' devices, registered as llama.cpp's --rpc does (common/arg.cpp).
    std::vector<ggml_backend_dev_t> devices;
    if (!rpc_servers.empty()) {
        ggml_backend_reg_t rpc = ggml_backend_reg_by_name("RPC");
        if (!rpc) {
            fprintf(stderr, "error: ggml's RPC backend is not available\n");
            return 1;
        }
        typedef ggml_backend_reg_t (*add_server_t)(const char * endpoint);
        auto add_server = (add_server_t) ggml_backend_reg_get_proc_address(rpc, "ggml_backend_rpc_add_server");
        if (!add_server) {
            fprintf(stderr, "error: the RPC backend has no ggml_backend_rpc_add_server\n");
            return 1;
        }
        for (size_t at = 0; at <= rpc_servers.size();) {
            size_t comma = rpc_servers.find(',', at);
            if (comma == std::string::npos) {
                comma = rpc_servers.size();
            }
            ggml_backend_reg_t server = add_server(rpc_servers.substr(at, comma - at).c_str());
            ggml_backend_register(server);
            for (size_t d = 0; d < ggml_backend_reg_dev_count(server); ++d) {
                devices.push_back(ggml_backend_reg_dev_get(server, d));
            }
            at = comma + 1;
        }
        devices.push_back(nullptr);
    }
    std::vector<float> tensor_split(llama_max_devices(), 0.0f);
    if (split.size() > tensor_split.size()) {
        fprintf(stderr, "error: -ts has more than %zu entries\n", tensor_split.size());
        return 2;
    }
    std::copy(split.begin(), split.end(), tensor_split.begin());

    llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = ngl;
    if (!devices.empty()) {
        mp.devices = devices.data();
    }
    if (!split.empty()) {
        mp.tensor_split = tensor_split.data();
    }
    llama_model * model = llama_model_load_from_file(model_path.c_str(), mp);
    if (!model) {
        fprintf(stderr, "error: cannot load %s\n", model_path.c_str());
        return 1;
    }
    const llama_vocab * vocab = llama_model_get_vocab(model);
    const int n_vocab = llama_vocab_n_tokens(vocab);
    const int n_prompt = -llama_tokenize(vocab, prompt.c_str(), prompt.size(), nullptr, 0, true, true);
    std::vector<llama_token> tokens(n_prompt);
    if (llama_tokenize(vocab, prompt.c_str(), prompt.size(), tokens.data(), n_prompt, true, true) < 0) {
        fprintf(stderr, "error: cannot tokenize the prompt\n");
        return 1;
    }

    if (n_seqs > n_prompt) {
        fprintf(stderr, "error: --seqs %d: the prompt has %d tokens\n", n_seqs, n_prompt);
        return 2;
    }
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = n_seqs * (n_prompt + n_predict);
    cp.n_batch = std::max(n_seqs * n_prompt, n_verify);
    cp.n_ubatch = cp.n_batch;
    cp.n_seq_max = n_seqs;
    cp.kv_unified = kv_unified;
    cp.offload_kqv = offload_kqv;
    llama_context * ctx = llama_init_from_model(model, cp);
    if (!ctx) {
        fprintf(stderr, "error: cannot create the context\n");
        return 1;
    }

    FILE * logits_file = nullptr;
    if (!logits_path.empty() && !(logits_file = fopen(logits_path.c_str(), "wb"))) {
        fprintf(stderr, "error: cannot write %s\n", logits_path.c_str());
        return 1;
    }

    std::vector<llama_token> generated;
    std::string text;
    // One position's logits: written, their argmax listed (and, `spoken`, its piece appended to
    // the text); returns the argmax.
    auto emit = [&](const float * logits, bool spoken) -> llama_token {
        if (logits_file && fwrite(logits, sizeof(float), n_vocab, logits_file) != (size_t) n_vocab) {
            fprintf(stderr, "error: cannot write the logits\n");
            exit(1);
        }
        llama_token best = 0;
        for (int t = 1; t < n_vocab; ++t) {
            if (logits[t] > logits[best]) {
                best = t;
            }
        }
        generated.push_back(best);
        char piece[256];
        const int n = llama_token_to_piece(vocab, best, piece, sizeof(piece), 0, true);
        if (spoken && n > 0) {
            text.append(piece, n);
        }
        return best;
    };

    // A round decodes `batch` and emits the logits of its `outputs` in order: first every
    // sequence's prompt, then one token of each sequence or, with --batch, N forced tokens.
    llama_batch_ext * batch = llama_batch_ext_init(ctx);
    std::vector<int32_t> outputs;
    std::vector<llama_pos> pos(n_seqs, 0);
    std::vector<llama_token> best(n_seqs);
    auto add = [&](llama_seq_id s, llama_token token, bool output) {
        const int32_t idx = llama_batch_ext_add_token(batch, s, token);
        llama_batch_ext_set_pos(batch, idx, &pos[s]);
        ++pos[s];
        if (output) {
            llama_batch_ext_set_output_logits(batch, idx, true);
            outputs.push_back(idx);
        }
    };
    for (int s = 0; s < n_seqs; ++s) {
        for (int i = 0; i < n_prompt - s; ++i) {
            add(s, tokens[i], i == n_prompt - s - 1);
        }
    }
    // n_predict steps of each sequence.
    const size_t rows = (size_t) n_predict * n_seqs;
    auto gen_start = std::chrono::steady_clock::now();
    for (int round = 0; generated.size() < rows; ++round) {
        if (round == 1) {
            gen_start = std::chrono::steady_clock::now();
        }
        if (llama_process(ctx, LLAMA_PROCESS_TYPE_DECODE, batch)) {
            fprintf(stderr, "error: decode failed at step %zu\n", generated.size());
            return 1;
        }
        for (size_t k = 0; k < outputs.size() && generated.size() < rows; ++k) {
            const float * logits = llama_get_logits_ith(ctx, outputs[k]);
            if (!logits) {
                fprintf(stderr, "error: no logits at step %zu\n", generated.size());
                return 1;
            }
            // With several sequences output k is sequence k's; with --batch all are sequence 0's.
            best[n_seqs > 1 ? k : 0] = emit(logits, n_seqs == 1 || k == 0);
        }
        const size_t done = generated.size();
        llama_batch_ext_clear(batch);
        outputs.clear();
        if (n_verify > 1) {
            // The token of the last step emitted and the forced ones after it.
            for (size_t i = done - 1; i < done - 1 + n_verify && (int) i < n_predict - 1; ++i) {
                add(0, forced[i], true);
            }
        } else {
            // Each sequence's token of the step just emitted: forced, or its argmax.
            for (int s = 0; s < n_seqs; ++s) {
                const size_t at = done - n_seqs + s;
                add(s, at < forced.size() ? forced[at] : best[s], true);
            }
        }
    }
    if (logits_file) {
        fclose(logits_file);
    }

    printf("prompt_tokens: %d\ntokens:", n_prompt);
    for (llama_token t : generated) {
        printf(" %d", t);
    }
    printf("\ntext: %s\n", text.c_str());
    const std::chrono::duration<double> gen = std::chrono::steady_clock::now() - gen_start;
    printf("gen_tokens: %d\ngen_seconds: %.6f\n", n_predict - 1, n_predict > 1 ? gen.count() : 0.0);

    llama_batch_ext_free(batch);
    llama_free(ctx);
    llama_model_free(model);
    llama_backend_free();
    return 0;
}
