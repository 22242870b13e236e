// Checks of Model::submit_sample / collect_ids (pipelined decode) shared by the CPU model's
// tests and the CUDA model's GPU tests: the pipelined loop draws exactly the tokens of the
// synchronous forward_sample loop, and the rules of the API are enforced.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <vector>

#include "flashdllm/kv_cache.h"
#include "flashdllm/model.h"
#include "model/model_test_util.h"

namespace fdl::test {

// Row r of step k: greedy for sequence 0 (for every sequence unless `sampled`), sampled
// (llama.cpp's defaults) for the others, with a fixed uniform per (step, sequence) so both
// loops draw from the same numbers.
inline RowSampling pipelined_row(size_t seq, int step, bool sampled) {
  RowSampling r;
  if (seq == 0 || !sampled) return r;
  r.temperature = 0.8f;
  r.top_k = 40;
  r.top_p = 0.95f;
  r.min_p = 0.05f;
  r.uniform = double((step * 7 + int(seq) * 13) % 97) / 97.0;
  return r;
}

// Decodes `steps` tokens for each prompt. Step k puts the sequences in the batch rotated by
// k, so a pipelined step's previous_step_id rows differ from its own rows. Returns the ids per
// sequence. host_argmax (with !pipelined): greedy from logits copied to the host instead.
inline std::vector<std::vector<int32_t>> decode_prompts(Model& m, KvCache& kv,
                                                        const std::vector<std::vector<int32_t>>& prompts, int steps,
                                                        bool pipelined, bool sampled = true,
                                                        bool host_argmax = false) {
  const size_t S = prompts.size();
  std::vector<SeqId> seqs;
  std::vector<int32_t> next(S);
  for (size_t s = 0; s < S; ++s) {
    seqs.push_back(kv.create_sequence());
    StepBatch b;
    const size_t first = kv.append_slots(seqs[s], prompts[s].size());
    for (size_t i = 0; i < prompts[s].size(); ++i)
      b.add(prompts[s][i], int32_t(first + i), seqs[s], i + 1 == prompts[s].size());
    std::vector<int32_t> ids;
    m.forward_argmax(b, kv, ids);
    next[s] = ids.at(0);
  }
  std::vector<std::vector<int32_t>> out(S);
  std::vector<size_t> prev_row(S);  // where each sequence sat in the previous pipelined step
  std::vector<size_t> order(S);     // sequence of each row of the step in flight
  std::vector<size_t> in_flight;
  StepBatch b;
  std::vector<RowSampling> rows(S);
  std::vector<int32_t> ids;
  for (int k = 0; k < steps; ++k) {
    b.clear();
    for (size_t r = 0; r < S; ++r) {
      const size_t s = (r + size_t(k)) % S;
      order[r] = s;
      const int32_t token = pipelined && k > 0 ? previous_step_id(int32_t(prev_row[s])) : next[s];
      b.add(token, int32_t(kv.append_slots(seqs[s], 1)), seqs[s], true);
      rows[r] = pipelined_row(s, k, sampled);
    }
    if (host_argmax) {  // greedy from the full logits rows, on the host
      std::vector<float> logits;
      m.forward(b, kv, logits);
      const int V = m.config().n_vocab;
      for (size_t r = 0; r < S; ++r) out[order[r]].push_back(next[order[r]] = argmax(logits.data() + r * size_t(V), V));
      continue;
    }
    if (!pipelined) {
      m.forward_sample(b, kv, rows, {}, ids);
      for (size_t r = 0; r < S; ++r) out[order[r]].push_back(next[order[r]] = ids.at(r));
      continue;
    }
    m.submit_sample(b, kv, rows, {});
    for (size_t r = 0; r < S; ++r) prev_row[order[r]] = r;
    if (k > 0) {  // the step before this one: its ids, while this one runs
      m.collect_ids(ids);
      for (size_t r = 0; r < S; ++r) out[in_flight[r]].push_back(ids.at(r));
    }
    in_flight = order;
  }
  if (pipelined && steps > 0) {
    m.collect_ids(ids);
    for (size_t r = 0; r < S; ++r) out[in_flight[r]].push_back(ids.at(r));
  }
  for (SeqId s : seqs) kv.free_sequence(s);
  return out;
}

inline void expect_pipelined_equals_synchronous(Model& m) {
  const std::vector<std::vector<int32_t>> prompts = {{1, 403, 22, 9}, {1, 17}, {1, 300, 301, 302, 303, 12, 44}};
  auto pool = make_pool(m, 256);
  KvCache kv(*pool);
  for (const bool sampled : {true, false}) {  // mixed rows (sampling kernel), greedy rows (argmax tail)
    const auto sync = decode_prompts(m, kv, prompts, 24, false, sampled);
    const auto piped = decode_prompts(m, kv, prompts, 24, true, sampled);
    EXPECT_EQ(m.submitted_steps(), 0u);
    for (size_t s = 0; s < prompts.size(); ++s) {
      ASSERT_EQ(sync[s].size(), 24u);
      EXPECT_EQ(piped[s], sync[s]) << "sequence " << s << (sampled ? " (sampled rows)" : " (greedy rows)");
    }
  }
}

inline void expect_pipeline_rules_enforced(Model& m) {
  auto pool = make_pool(m, 64);
  KvCache kv(*pool);
  const SeqId seq = prefill_sequence(m, kv, {1, 5, 9});
  std::vector<int32_t> ids;
  const RowSampling greedy{};
  auto step = [&](int32_t token) {
    StepBatch b;
    b.add(token, int32_t(kv.append_slots(seq, 1)), seq, true);
    return b;
  };
  EXPECT_THROW(m.collect_ids(ids), std::logic_error);
  // previous_step_id needs a previous submit_sample step (a plain forward just ran).
  EXPECT_THROW(m.submit_sample(step(previous_step_id(0)), kv, {&greedy, 1}, {}), std::invalid_argument);
  kv.truncate(seq, 3);
  m.submit_sample(step(7), kv, {&greedy, 1}, {});
  EXPECT_EQ(m.submitted_steps(), 1u);
  // Row 1 of a one-row step; a bad row count; a plain forward while a step is out.
  EXPECT_THROW(m.submit_sample(step(previous_step_id(1)), kv, {&greedy, 1}, {}), std::out_of_range);
  kv.truncate(seq, 4);
  EXPECT_THROW(m.submit_sample(step(previous_step_id(0)), kv, {}, {}), std::invalid_argument);
  kv.truncate(seq, 4);
  std::vector<float> logits;
  EXPECT_THROW(m.forward(step(3), kv, logits), std::logic_error);
  kv.truncate(seq, 4);
  EXPECT_THROW(m.forward_argmax(step(3), kv, ids), std::logic_error);
  kv.truncate(seq, 4);
  EXPECT_EQ(m.submitted_steps(), 1u);
  m.submit_sample(step(previous_step_id(0)), kv, {&greedy, 1}, {});
  EXPECT_THROW(m.submit_sample(step(previous_step_id(0)), kv, {&greedy, 1}, {}), std::logic_error);
  kv.truncate(seq, 5);
  EXPECT_EQ(m.submitted_steps(), 2u);
  std::vector<int32_t> first, second;
  m.collect_ids(first);
  m.collect_ids(second);
  EXPECT_EQ(m.submitted_steps(), 0u);
  ASSERT_EQ(first.size(), 1u);
  ASSERT_EQ(second.size(), 1u);
  // Each step's own ids (the refused submits in between must not have made the second step
  // share the first one's buffers), and the chained step saw the first step's id: the same
  // as feeding it by hand.
  kv.truncate(seq, 3);
  m.forward_argmax(step(7), kv, ids);
  EXPECT_EQ(ids, first);
  StepBatch b = step(first[0]);
  m.forward_argmax(b, kv, ids);
  EXPECT_EQ(ids, second);
  // After that plain forward there is nothing to refer to.
  EXPECT_THROW(m.submit_sample(step(previous_step_id(0)), kv, {&greedy, 1}, {}), std::invalid_argument);
  kv.free_sequence(seq);
}

// A chained step much larger than the one before it (scratch grows under a submitted step,
// and the previous step's ids must move along): each of 40 new sequences takes the id the
// one-row step drew, as if fed by hand. `m` should be freshly loaded (small scratch).
inline void expect_chain_survives_scratch_growth(Model& m) {
  auto pool = make_pool(m, 64 * 48);
  KvCache kv(*pool);
  const SeqId first = prefill_sequence(m, kv, {1, 5, 9});
  const RowSampling greedy{};
  StepBatch b;
  b.add(11, int32_t(kv.append_slots(first, 1)), first, true);
  m.submit_sample(b, kv, {&greedy, 1}, {});
  std::vector<SeqId> seqs;
  b.clear();
  for (int s = 0; s < 40; ++s) {
    seqs.push_back(kv.create_sequence());
    const size_t at = kv.append_slots(seqs.back(), 2);
    b.add(1, int32_t(at), seqs.back(), false);
    b.add(previous_step_id(0), int32_t(at + 1), seqs.back(), true);
  }
  const std::vector<RowSampling> rows(40);
  m.submit_sample(b, kv, rows, {});
  std::vector<int32_t> drawn, piped;
  m.collect_ids(drawn);
  m.collect_ids(piped);
  ASSERT_EQ(drawn.size(), 1u);
  ASSERT_EQ(piped.size(), 40u);
  for (SeqId s : seqs) kv.truncate(s, 1);
  b.clear();
  for (SeqId s : seqs) b.add(drawn[0], int32_t(kv.append_slots(s, 1)), s, true);
  std::vector<int32_t> by_hand;
  m.forward_argmax(b, kv, by_hand);
  EXPECT_EQ(piped, by_hand);
}

// A step whose logits row holds NaN fails: on the GPU at its collect_ids (and the chained
// step after it at its own, its token being the failed row's), with the default pipeline at
// submit_sample. Nothing is left submitted either way. `m` has NaN logits for every input.
inline void expect_failed_rows_fail_their_steps(Model& m) {
  auto pool = make_pool(m, 64);
  KvCache kv(*pool);
  const SeqId seq = prefill_sequence(m, kv, {1, 5, 9});
  const RowSampling greedy{};
  auto step = [&](int32_t token) {
    StepBatch b;
    b.add(token, int32_t(kv.append_slots(seq, 1)), seq, true);
    return b;
  };
  std::vector<int32_t> ids;
  try {
    m.submit_sample(step(7), kv, {&greedy, 1}, {});
  } catch (const std::invalid_argument&) {  // the default pipeline runs the step in submit
    EXPECT_EQ(m.submitted_steps(), 0u);
    kv.free_sequence(seq);
    return;
  }
  m.submit_sample(step(previous_step_id(0)), kv, {&greedy, 1}, {});
  EXPECT_THROW(m.collect_ids(ids), std::invalid_argument);
  EXPECT_THROW(m.collect_ids(ids), std::invalid_argument);
  EXPECT_EQ(m.submitted_steps(), 0u);
  // The model goes on: a plain forward with logits works (they are NaN, as before).
  std::vector<float> logits;
  kv.truncate(seq, 3);
  m.forward(step(7), kv, logits);
  EXPECT_TRUE(std::isnan(logits.at(0)) || std::any_of(logits.begin(), logits.end(), [](float v) { return std::isnan(v); }));
  kv.free_sequence(seq);
}
}  // namespace fdl::test
