// The native sampler: turns rows of logits into tokens without the GIL.
//
// One Sampler serves a fixed number of slots (one per sequence the engine can run at once).
// Each slot has its own parameters, seeded RNG and penalty history, so a request's tokens depend
// only on its own seed and logits, never on which other requests shared the tick.
//
// Pipeline per row (the order users of Hugging Face and vLLM expect):
//   penalties -> temperature -> top-k -> top-p -> min-p -> draw
// A temperature <= 0 means greedy: the arg-max after penalties, every filter ignored.
//
// `sample` runs on the calling thread; `submit` hands the same work to the sampler's own thread
// and `wait` joins it, so Python can do other work of the tick in between.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

namespace uma {

struct SamplingParams {
    float temperature = 0.0f;      // <= 0: greedy
    int32_t top_k = 0;             // <= 0: off
    float top_p = 1.0f;            // >= 1: off
    float min_p = 0.0f;            // <= 0: off
    float repeat_penalty = 1.0f;   // 1: off; llama.cpp's rule (divide positive, multiply negative)
    float frequency_penalty = 0.0f;
    float presence_penalty = 0.0f;
    int32_t penalty_last_n = 64;   // window of recent tokens the penalties look at; 0: off
    uint64_t seed = 0;
};

// One logits row to sample, and where to put the answer.
struct SampleJob {
    const float * logits = nullptr;   // row r starts at logits + rows[i] * n_vocab
    const int32_t * rows = nullptr;
    const int32_t * slots = nullptr;
    int32_t n = 0;
    int32_t * out_tokens = nullptr;
    float * out_logprobs = nullptr;   // may be null: no log-probabilities wanted
    // Token masks (constrained decoding): row i samples only tokens whose bit is set in the
    // mask at masks + mask_index[i] * mask_words (token t: bit t % 32 of word t / 32). A null
    // mask_index, or mask_index[i] < 0: the row is not constrained. Log-probabilities stay
    // those of the model's own distribution.
    const uint32_t * masks = nullptr;
    const int32_t * mask_index = nullptr;
    int32_t mask_words = 0;
};

struct Candidate {
    float logit;
    int32_t id;
};

constexpr int32_t kDrawBlock = 1024;  // tokens per block sum of the tempered draw

// Per-thread buffers for one row at a time.
struct Workspace {
    std::vector<float> scratch;      // a penalised copy of the row
    std::vector<float> weights;      // exp of each scaled logit (the tempered draw)
    std::vector<float> block_sums;   // their sums by block of kDrawBlock tokens
    std::vector<Candidate> cands;    // survivors of the filters
    float cands_max = 0.0f;          // largest scaled logit among them
    bool sorted = false;             // cands is most probable first
};

class Sampler {
public:
    // n_threads: threads that share the rows of one job (the caller included); 0 picks the
    // hardware's count, at most 8. Rows are independent: each belongs to its own slot.
    Sampler(int32_t n_slots, int32_t n_vocab, int32_t n_threads = 0);
    ~Sampler();
    Sampler(const Sampler &) = delete;
    Sampler & operator=(const Sampler &) = delete;

    int32_t n_slots() const { return static_cast<int32_t>(slots_.size()); }
    int32_t n_vocab() const { return n_vocab_; }

    // Resets the slot: new parameters, RNG reseeded, penalty history emptied.
    void configure(int32_t slot, const SamplingParams & params);
    // Adds tokens (a prompt, say) to the slot's penalty history.
    void accept(int32_t slot, const int32_t * tokens, int32_t n);
    // Values added to these tokens' logits before sampling (OpenAI's logit_bias), until the
    // slot is configured again.
    void set_bias(int32_t slot, const int32_t * tokens, const float * values, int32_t n);

    // Samples every row of the job on this thread; sampled tokens join their slot's history.
    void sample(const SampleJob & job);
    // The same on the sampler thread; returns at once. One job may be in flight at a time.
    void submit(const SampleJob & job);
    // Blocks until the submitted job is done. No-op when nothing is in flight.
    void wait();
    bool busy();

    // The candidates that survive the filters for this slot and row, most probable first, with
    // their probabilities after renormalisation. Returns how many; out arrays hold n_vocab.
    int32_t candidates(int32_t slot, const float * row, int32_t * out_ids, float * out_probs);

    // The k most probable tokens of each of n rows by the model's own distribution (log
    // softmax of the raw logits, as the sampled token's log-probability is), most probable
    // first: out_ids and out_logprobs hold n * k entries. Independent of every slot.
    void top_logprobs(const float * logits, const int32_t * rows, int32_t n, int32_t k,
                      int32_t * out_ids, float * out_logprobs) const;

private:
    struct Slot {
        SamplingParams params;
        std::mt19937_64 rng;
        std::vector<int32_t> window;   // ring buffer of the last penalty_last_n tokens
        size_t window_pos = 0;
        size_t window_fill = 0;
        std::unordered_map<int32_t, int32_t> counts;
        std::vector<std::pair<int32_t, float>> bias;   // logit_bias
        void remember(int32_t token);
    };

    int32_t sample_row(Workspace & ws, Slot & slot, const float * row, float * logprob,
                       const uint32_t * mask);
    // Temperature (and min-p) alone, the common case: a draw from softmax(row / T) in three
    // vectorised passes over the row, no candidate list (top-k and top-p need one).
    int32_t draw_tempered(Workspace & ws, Slot & slot, const float * row);
    void sample_rows(Workspace & ws, const SampleJob & job, int32_t i);
    // Scales `row` by the temperature into ws.cands and applies top-k, top-p and min-p there.
    void filter(Workspace & ws, Slot & slot, const float * row, bool need_sorted);
    // The row itself when no penalty or bias applies, else a penalised, biased copy in
    // ws.scratch: llama.cpp's logits buffer is shared with zero-copy views, never written.
    const float * penalised(Workspace & ws, Slot & slot, const float * row);
    // `row` (or its penalised copy) with the tokens the mask leaves out at -infinity, in
    // ws.scratch; the row itself when there is no mask.
    const float * masked(Workspace & ws, const float * row, const uint32_t * mask);
    double uniform(Slot & slot);
    void worker_loop();
    void pool_loop(int32_t index);

    int32_t n_vocab_;
    std::vector<Slot> slots_;
    std::vector<Workspace> ws_;   // ws_[0] for the calling thread, ws_[k] for pool thread k
    // slot_job_[s] == job_stamp_: slot s already has a row in the job being checked
    std::vector<uint64_t> slot_job_;
    uint64_t job_stamp_ = 0;
    bool slots_repeat(const SampleJob & job);

    // Row-parallel pool: threads take rows of pool_job_ through next_row_.
    std::vector<std::thread> pool_;
    std::mutex pool_mu_;
    std::condition_variable pool_cv_;
    std::condition_variable pool_done_cv_;
    const SampleJob * pool_job_ = nullptr;
    std::atomic<int32_t> next_row_{0};
    uint64_t pool_gen_ = 0;
    int32_t pool_busy_ = 0;
    bool pool_stop_ = false;

    std::mutex mu_;
    std::condition_variable cv_job_;
    std::condition_variable cv_done_;
    SampleJob pending_;
    bool has_job_ = false;
    bool stop_ = false;
    std::thread worker_;
};

}  // namespace uma
