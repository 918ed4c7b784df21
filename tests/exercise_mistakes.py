"""Plausible wrong answers to every exercise of the course, for tests/test_course.py: each must fail the exercise's
tests (the cells after it) while the reference solution passes them. A teacher can read them as the mistakes the
tests are built to catch.

MISTAKES maps (notebook stem, function name) to [(what is wrong, the wrong function's source)]; the source replaces
the reference function in the exercise cell, everything else in the cell (imports, set-up) stays.
"""

MISTAKES = {
    ("00_sampling_params", "my_accepted"): [
        ('top_p = 0 accepted', '''
def my_accepted(temperature, top_p, top_k, min_p):
    return (
        math.isfinite(temperature)
        and temperature >= 0
        and 0 <= top_p <= 1
        and top_k >= -1
        and 0 <= min_p <= 1
    )
'''),
        ('top_k = -1 refused (only 0 for no cut)', '''
def my_accepted(temperature, top_p, top_k, min_p):
    return (
        math.isfinite(temperature)
        and temperature >= 0
        and 0 < top_p <= 1
        and top_k >= 0
        and 0 <= min_p <= 1
    )
'''),
        ('temperature = 0 refused (greedy is temperature 0)', '''
def my_accepted(temperature, top_p, top_k, min_p):
    return (
        math.isfinite(temperature)
        and temperature > 0
        and 0 < top_p <= 1
        and top_k >= -1
        and 0 <= min_p <= 1
    )
'''),
        ('an infinite temperature accepted', '''
def my_accepted(temperature, top_p, top_k, min_p):
    return (
        temperature >= 0
        and 0 < top_p <= 1
        and top_k >= -1
        and 0 <= min_p <= 1
    )
'''),
        ('min_p = 1 refused', '''
def my_accepted(temperature, top_p, top_k, min_p):
    return (
        math.isfinite(temperature)
        and temperature >= 0
        and 0 < top_p <= 1
        and top_k >= -1
        and 0 <= min_p < 1
    )
'''),
    ],
    ("00c_sampling_verify", "my_check_logprobs"): [
        ('-1 requested taken as a number (always within the limit)', '''
def my_check_logprobs(n, vocab_size, max_logprobs=20):
    limit = vocab_size if max_logprobs == -1 else max_logprobs
    if n and n > limit:
        raise ValueError(f"Requested logprobs of {n}, which is greater than max allowed: {limit}")
'''),
        ('a limit of -1 taken as a number (everything refused)', '''
def my_check_logprobs(n, vocab_size, max_logprobs=20):
    limit = max_logprobs
    n = vocab_size if n == -1 else n
    if n and n > limit:
        raise ValueError(f"Requested logprobs of {n}, which is greater than max allowed: {limit}")
'''),
        ('the limit itself refused (>= instead of >)', '''
def my_check_logprobs(n, vocab_size, max_logprobs=20):
    limit = vocab_size if max_logprobs == -1 else max_logprobs
    n = vocab_size if n == -1 else n
    if n and n >= limit:
        raise ValueError(f"Requested logprobs of {n}, which is greater than max allowed: {limit}")
'''),
        ('the vocabulary as the limit whatever max_logprobs says', '''
def my_check_logprobs(n, vocab_size, max_logprobs=20):
    limit = vocab_size
    n = vocab_size if n == -1 else n
    if n and n > limit:
        raise ValueError(f"Requested logprobs of {n}, which is greater than max allowed: {limit}")
'''),
    ],
    ("01_request", "my_finish"): [
        ("EOS counts before min_tokens", '''
def my_finish(output_ids, num_prompt_tokens, eos_token_id, sp, max_model_len):
    last, n = output_ids[-1], len(output_ids)
    if (not sp.ignore_eos and last == eos_token_id) or last in sp.stop_token_ids:
        return "stop"
    if num_prompt_tokens + n >= max_model_len or (sp.max_tokens is not None and n >= sp.max_tokens):
        return "length"
    return None
'''),
        ("ignore_eos is ignored", '''
def my_finish(output_ids, num_prompt_tokens, eos_token_id, sp, max_model_len):
    last, n = output_ids[-1], len(output_ids)
    if n >= sp.min_tokens and (last == eos_token_id or last in sp.stop_token_ids):
        return "stop"
    if num_prompt_tokens + n >= max_model_len or (sp.max_tokens is not None and n >= sp.max_tokens):
        return "length"
    return None
'''),
        ("the lengths are looked at before the last token", '''
def my_finish(output_ids, num_prompt_tokens, eos_token_id, sp, max_model_len):
    last, n = output_ids[-1], len(output_ids)
    if num_prompt_tokens + n >= max_model_len or (sp.max_tokens is not None and n >= sp.max_tokens):
        return "length"
    if n >= sp.min_tokens:
        if (not sp.ignore_eos and last == eos_token_id) or last in sp.stop_token_ids:
            return "stop"
    return None
'''),
        ("max_model_len compared with the output alone", '''
def my_finish(output_ids, num_prompt_tokens, eos_token_id, sp, max_model_len):
    last, n = output_ids[-1], len(output_ids)
    if n >= sp.min_tokens:
        if (not sp.ignore_eos and last == eos_token_id) or last in sp.stop_token_ids:
            return "stop"
    if n >= max_model_len or (sp.max_tokens is not None and n >= sp.max_tokens):
        return "length"
    return None
'''),
        ("stop_token_ids do not wait for min_tokens", '''
def my_finish(output_ids, num_prompt_tokens, eos_token_id, sp, max_model_len):
    last, n = output_ids[-1], len(output_ids)
    if last in sp.stop_token_ids or (n >= sp.min_tokens and not sp.ignore_eos and last == eos_token_id):
        return "stop"
    if num_prompt_tokens + n >= max_model_len or (sp.max_tokens is not None and n >= sp.max_tokens):
        return "length"
    return None
'''),
    ],
    ("01_request", "my_legal"): [
        ("a preempted request may go back to WAITING", '''
def my_legal(history):
    if not history or history[0] != RequestStatus.WAITING:
        return False
    ok = {a: set(b) for a, b in ALLOWED_TRANSITIONS.items()}
    ok[RequestStatus.PREEMPTED].add(RequestStatus.WAITING)
    return all(b in ok.get(a, ()) for a, b in zip(history, history[1:]))
'''),
        ("the first status is not checked", '''
def my_legal(history):
    return all(b in ALLOWED_TRANSITIONS.get(a, ()) for a, b in zip(history, history[1:]))
'''),
        ("only the last move is checked", '''
def my_legal(history):
    if not history or history[0] != RequestStatus.WAITING:
        return False
    return len(history) < 2 or history[-1] in ALLOWED_TRANSITIONS.get(history[-2], ())
'''),
        ("staying in a status counts as a move", '''
def my_legal(history):
    if not history or history[0] != RequestStatus.WAITING:
        return False
    return all(a == b or b in ALLOWED_TRANSITIONS.get(a, ()) for a, b in zip(history, history[1:]))
'''),
    ],
    ("02_block_manager", "my_num_new_blocks"): [
        ("rounds down", '''
def my_num_new_blocks(num_computed_tokens, num_new_tokens, num_blocks_held, block_size):
    return max((num_computed_tokens + num_new_tokens) // block_size - num_blocks_held, 0)
'''),
        ("forgets the blocks already held", '''
def my_num_new_blocks(num_computed_tokens, num_new_tokens, num_blocks_held, block_size):
    return -(-(num_computed_tokens + num_new_tokens) // block_size)
'''),
        ("counts the new tokens only", '''
def my_num_new_blocks(num_computed_tokens, num_new_tokens, num_blocks_held, block_size):
    return -(-num_new_tokens // block_size)
'''),
    ],
    ("02_block_manager", "my_slots"): [
        ("positions are block ids", '''
def my_slots(block_table, start, num_tokens, block_size):
    return [t // block_size * block_size + t % block_size for t in range(start, start + num_tokens)]
'''),
        ("starts at position 0", '''
def my_slots(block_table, start, num_tokens, block_size):
    return [block_table[t // block_size] * block_size + t % block_size for t in range(num_tokens)]
'''),
        ("offset from the table index, not the block id", '''
def my_slots(block_table, start, num_tokens, block_size):
    return [block_table[t // block_size] + t % block_size for t in range(start, start + num_tokens)]
'''),
    ],
    ("03_scheduler", "my_token_split"): [
        ("running requests get all they want, whatever the budget", '''
def my_token_split(running, waiting, token_budget, max_num_seqs):
    out, left = {}, token_budget
    for rid, want in running:
        out[rid] = want
        left = max(left - want, 0)
    for rid, n in waiting:
        if left == 0 or len(out) >= max_num_seqs:
            break
        out[rid] = min(n, left)
        left -= out[rid]
    return out
'''),
        ("running requests do not count toward max_num_seqs", '''
def my_token_split(running, waiting, token_budget, max_num_seqs):
    out, left = {}, token_budget
    for rid, want in running:
        if left == 0:
            break
        out[rid] = min(want, left)
        left -= out[rid]
    admitted = 0
    for rid, n in waiting:
        if left == 0 or admitted >= max_num_seqs:
            break
        out[rid] = min(n, left)
        left -= out[rid]
        admitted += 1
    return out
'''),
        ("waiting requests first", '''
def my_token_split(running, waiting, token_budget, max_num_seqs):
    out, left = {}, token_budget
    for rid, n in waiting:
        if left == 0 or len(out) >= max_num_seqs:
            break
        out[rid] = min(n, left)
        left -= out[rid]
    for rid, want in running:
        if left == 0:
            break
        out[rid] = min(want, left)
        left -= out[rid]
    return out
'''),
        ("a prompt longer than the budget left waits instead of taking a chunk", '''
def my_token_split(running, waiting, token_budget, max_num_seqs):
    out, left = {}, token_budget
    for rid, want in running:
        if left == 0:
            break
        out[rid] = min(want, left)
        left -= out[rid]
    for rid, n in waiting:
        if n > left or len(out) >= max_num_seqs:
            break
        out[rid] = n
        left -= n
    return out
'''),
    ],
    ("03_scheduler", "my_victim"): [
        ("priority ignores the arrival time", '''
def my_victim(running, policy):
    if policy == "fcfs":
        return running[-1][0]
    return max(running, key=lambda r: r[1])[0]
'''),
        ("fcfs takes the first admitted", '''
def my_victim(running, policy):
    if policy == "fcfs":
        return running[0][0]
    return max(running, key=lambda r: (r[1], r[2]))[0]
'''),
        ("the most urgent is preempted", '''
def my_victim(running, policy):
    if policy == "fcfs":
        return running[-1][0]
    return min(running, key=lambda r: (r[1], r[2]))[0]
'''),
        ("ties go to the earlier arrival", '''
def my_victim(running, policy):
    if policy == "fcfs":
        return running[-1][0]
    return max(running, key=lambda r: (r[1], -r[2]))[0]
'''),
    ],
    ("04_paged_attention", "my_write_kv"): [
        ("keys and values swapped", '''
def my_write_kv(key, value, kv_cache, slot_mapping):
    bs = kv_cache.shape[2]
    for i, s in enumerate(slot_mapping.tolist()):
        kv_cache[0, s // bs, s % bs] = value[i]
        kv_cache[1, s // bs, s % bs] = key[i]
'''),
        ("the block size read from the wrong dimension", '''
def my_write_kv(key, value, kv_cache, slot_mapping):
    bs = kv_cache.shape[1]
    for i, s in enumerate(slot_mapping.tolist()):
        kv_cache[0, s // bs, s % bs] = key[i]
        kv_cache[1, s // bs, s % bs] = value[i]
'''),
        ("token i written at slot i", '''
def my_write_kv(key, value, kv_cache, slot_mapping):
    bs = kv_cache.shape[2]
    for i, s in enumerate(slot_mapping.tolist()):
        kv_cache[0, i // bs, i % bs] = key[i]
        kv_cache[1, i // bs, i % bs] = value[i]
'''),
    ],
    ("04_paged_attention", "my_decode_attention"): [
        ("no scale", '''
def my_decode_attention(q, kv_cache, block_table, seq_len, scale):
    bs, hkv = kv_cache.shape[2], kv_cache.shape[3]
    slots = [block_table[t // bs] * bs + t % bs for t in range(seq_len)]
    flat = kv_cache.flatten(1, 2)
    k, v = flat[0, slots], flat[1, slots]
    group = q.shape[0] // hkv
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    return torch.einsum("ht,thd->hd", torch.einsum("hd,thd->ht", q, k).softmax(-1), v)
'''),
        ("K/V heads tiled instead of repeated (head h reads h % kv_heads)", '''
def my_decode_attention(q, kv_cache, block_table, seq_len, scale):
    bs, hkv = kv_cache.shape[2], kv_cache.shape[3]
    slots = [block_table[t // bs] * bs + t % bs for t in range(seq_len)]
    flat = kv_cache.flatten(1, 2)
    k, v = flat[0, slots], flat[1, slots]
    group = q.shape[0] // hkv
    k, v = k.repeat(1, group, 1), v.repeat(1, group, 1)
    att = (torch.einsum("hd,thd->ht", q, k) * scale).softmax(-1)
    return torch.einsum("ht,thd->hd", att, v)
'''),
        ("the blocks read in order 0, 1, 2, … instead of through the table", '''
def my_decode_attention(q, kv_cache, block_table, seq_len, scale):
    bs, hkv = kv_cache.shape[2], kv_cache.shape[3]
    flat = kv_cache.flatten(1, 2)
    k, v = flat[0, :seq_len], flat[1, :seq_len]
    group = q.shape[0] // hkv
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    att = (torch.einsum("hd,thd->ht", q, k) * scale).softmax(-1)
    return torch.einsum("ht,thd->hd", att, v)
'''),
        ("softmax over the heads", '''
def my_decode_attention(q, kv_cache, block_table, seq_len, scale):
    bs, hkv = kv_cache.shape[2], kv_cache.shape[3]
    slots = [block_table[t // bs] * bs + t % bs for t in range(seq_len)]
    flat = kv_cache.flatten(1, 2)
    k, v = flat[0, slots], flat[1, slots]
    group = q.shape[0] // hkv
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    att = (torch.einsum("hd,thd->ht", q, k) * scale).softmax(0)
    return torch.einsum("ht,thd->hd", att, v)
'''),
    ],
    ("05_model", "my_rms_norm"): [
        ("the mean of |x| instead of the root mean square", '''
def my_rms_norm(x, weight, eps):
    xf = x.float()
    return weight * (xf / (xf.abs().mean(-1, keepdim=True) + eps)).to(x.dtype)
'''),
        ("eps added outside the square root", '''
def my_rms_norm(x, weight, eps):
    xf = x.float()
    return weight * (xf / (xf.pow(2).mean(-1, keepdim=True).sqrt() + eps)).to(x.dtype)
'''),
        ("the whole tensor's mean, not each row's", '''
def my_rms_norm(x, weight, eps):
    xf = x.float()
    return weight * (xf * torch.rsqrt(xf.pow(2).mean() + eps)).to(x.dtype)
'''),
        ("no weight", '''
def my_rms_norm(x, weight, eps):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
'''),
    ],
    ("05_model", "my_rope"): [
        ("pairs neighbouring dimensions (GPT-J's interleaved rotation)", '''
def my_rope(x, positions, theta):
    D = x.shape[-1]
    inv_freq = theta ** (-torch.arange(0, D, 2, dtype=torch.float32) / D)
    angles = (positions[:, None].float() * inv_freq)[:, None]
    x1, x2 = x[..., 0::2], x[..., 1::2]
    out = torch.stack([x1 * angles.cos() - x2 * angles.sin(), x1 * angles.sin() + x2 * angles.cos()], -1)
    return out.flatten(-2)
'''),
        ("rotate_half with the sign on the wrong half", '''
def my_rope(x, positions, theta):
    D = x.shape[-1]
    inv_freq = theta ** (-torch.arange(0, D, 2, dtype=torch.float32) / D)
    emb = torch.cat([positions[:, None].float() * inv_freq] * 2, -1)[:, None]
    x1, x2 = x.chunk(2, -1)
    return x * emb.cos() + torch.cat([x2, -x1], -1) * emb.sin()
'''),
        ("the exponent's sign flipped: frequencies that grow", '''
def my_rope(x, positions, theta):
    D = x.shape[-1]
    inv_freq = theta ** (torch.arange(0, D, 2, dtype=torch.float32) / D)
    emb = torch.cat([positions[:, None].float() * inv_freq] * 2, -1)[:, None]
    x1, x2 = x.chunk(2, -1)
    return x * emb.cos() + torch.cat([-x2, x1], -1) * emb.sin()
'''),
        ("angles interleaved (repeat_interleave) instead of one per half", '''
def my_rope(x, positions, theta):
    D = x.shape[-1]
    inv_freq = theta ** (-torch.arange(0, D, 2, dtype=torch.float32) / D)
    emb = (positions[:, None].float() * inv_freq).repeat_interleave(2, -1)[:, None]
    x1, x2 = x.chunk(2, -1)
    return x * emb.cos() + torch.cat([-x2, x1], -1) * emb.sin()
'''),
    ],
    ("06_sampler", "my_top_p_mask"): [
        ("keeps a token while the mass up to and including it is below p", '''
def my_top_p_mask(logits, p):
    probs, idx = logits.softmax(-1).sort(descending=True)
    keep = torch.zeros_like(logits, dtype=torch.bool)
    keep[idx] = probs.cumsum(-1) < p
    return keep
'''),
        ("sorted ascending", '''
def my_top_p_mask(logits, p):
    probs, idx = logits.softmax(-1).sort()
    keep = torch.zeros_like(logits, dtype=torch.bool)
    keep[idx] = probs.cumsum(-1) - probs < p
    return keep
'''),
        ("the mask left in sorted order", '''
def my_top_p_mask(logits, p):
    probs, idx = logits.softmax(-1).sort(descending=True)
    return probs.cumsum(-1) - probs < p
'''),
        ("a probability threshold instead of a mass", '''
def my_top_p_mask(logits, p):
    probs = logits.softmax(-1)
    return probs >= (1 - p) * probs.max()
'''),
    ],
    ("06_sampler", "my_sample"): [
        ("multiplies by the temperature", '''
def my_sample(logits, temperature, generator):
    if temperature == 0:
        return int(logits.argmax())
    return int(torch.multinomial((logits * temperature).softmax(-1), 1, generator=generator))
'''),
        ("always greedy", '''
def my_sample(logits, temperature, generator):
    return int(logits.argmax())
'''),
        ("draws from the logits, not their softmax", '''
def my_sample(logits, temperature, generator):
    if temperature == 0:
        return int(logits.argmax())
    return int(torch.multinomial((logits / temperature).clamp(min=0), 1, generator=generator))
'''),
        ("draws uniformly", '''
def my_sample(logits, temperature, generator):
    if temperature == 0:
        return int(logits.argmax())
    return int(torch.randint(len(logits), (1,), generator=generator))
'''),
    ],
    ("09_engine_core", "my_num_steps"): [
        ("one step per token, the prompt in one step whatever the budget", '''
def my_num_steps(num_prompt_tokens, max_tokens, token_budget):
    return 1 + max_tokens - 1
'''),
        ("the prompt's last step samples nothing", '''
def my_num_steps(num_prompt_tokens, max_tokens, token_budget):
    return -(-num_prompt_tokens // token_budget) + max_tokens
'''),
        ("rounds the prompt's steps down", '''
def my_num_steps(num_prompt_tokens, max_tokens, token_budget):
    return max(num_prompt_tokens // token_budget, 1) + max_tokens - 1
'''),
    ],
    ("09_engine_core", "my_run"): [
        ("one step only", '''
def my_run(core):
    tokens, reasons = {}, {}
    for o in core.step().outputs:
        tokens.setdefault(o.request_id, []).extend(o.new_token_ids)
        if o.finished:
            reasons[o.request_id] = o.finish_reason
    return tokens, reasons
'''),
        ("each step's tokens replace the last", '''
def my_run(core):
    tokens, reasons = {}, {}
    while core.has_unfinished_requests():
        for o in core.step().outputs:
            tokens[o.request_id] = list(o.new_token_ids)
            if o.finished:
                reasons[o.request_id] = o.finish_reason
    return tokens, reasons
'''),
        ("stops when the first request finishes", '''
def my_run(core):
    tokens, reasons = {}, {}
    while not reasons:
        for o in core.step().outputs:
            tokens.setdefault(o.request_id, []).extend(o.new_token_ids)
            if o.finished:
                reasons[o.request_id] = o.finish_reason
    return tokens, reasons
'''),
    ],
    ("12_llm_engine", "my_abort_big"): [
        ("counts the first sequence of each request only", '''
def my_abort_big(engine, max_blocks):
    kv = engine.kv_cache_manager
    big = [r for r, seqs in engine.children.items() if len(kv.get_block_ids(seqs[0])) > max_blocks]
    engine.abort_request(big)
    return big
'''),
        ("the blocks of the request id, not of its sequences", '''
def my_abort_big(engine, max_blocks):
    kv = engine.kv_cache_manager
    held = {r: len(kv.get_block_ids(r)) for r in engine.children}
    big = [r for r, n in held.items() if n > max_blocks]
    engine.abort_request(big)
    return big
'''),
        ("aborts the sequences, not the requests", '''
def my_abort_big(engine, max_blocks):
    kv = engine.kv_cache_manager
    held = {r: sum(len(kv.get_block_ids(s)) for s in seqs) for r, seqs in engine.children.items()}
    big = [r for r, n in held.items() if n > max_blocks]
    engine.abort_request([s for r in big for s in engine.children[r]])
    return big
'''),
    ],
    ("12_llm_engine", "my_stream"): [
        ("cumulative outputs joined (the default output_kind)", '''
def my_stream(engine, request_id, prompt, sp):
    engine.add_request(request_id, prompt, sp)
    pieces, finished = [], False
    while not finished:
        for o in engine.step():
            if o.request_id == request_id:
                pieces += [o.outputs[0].text] if o.outputs[0].text else []
                finished = o.finished
    return pieces
'''),
        ("the caller's params changed in place", '''
def my_stream(engine, request_id, prompt, sp):
    sp.output_kind = RequestOutputKind.DELTA
    engine.add_request(request_id, prompt, sp)
    pieces, finished = [], False
    while not finished:
        for o in engine.step():
            if o.request_id == request_id:
                pieces += [o.outputs[0].text] if o.outputs[0].text else []
                finished = o.finished
    return pieces
'''),
        ("the finishing step's piece left out", '''
def my_stream(engine, request_id, prompt, sp):
    engine.add_request(request_id, prompt, dataclasses.replace(sp, output_kind=RequestOutputKind.DELTA))
    pieces, finished = [], False
    while not finished:
        for o in engine.step():
            if o.request_id == request_id:
                finished = o.finished
                pieces += [o.outputs[0].text] if o.outputs[0].text and not finished else []
    return pieces
'''),
    ],
    ("13_llm", "my_generate"): [
        ("outputs in the order they finished", '''
def my_generate(engine, prompts, params):
    for i, (p, sp) in enumerate(zip(prompts, params)):
        engine.add_request(f"ex{i}", p, sp)
    done = []
    while engine.has_unfinished_requests():
        done += [o for o in engine.step() if o.finished]
    return done
'''),
        ("the first SamplingParams for every prompt", '''
def my_generate(engine, prompts, params):
    for i, p in enumerate(prompts):
        engine.add_request(f"ex{i}", p, params[0])
    done = {}
    while engine.has_unfinished_requests():
        for o in engine.step():
            if o.finished:
                done[o.request_id] = o
    return [done[f"ex{i}"] for i in range(len(prompts))]
'''),
        ("every output kept, not only the finished ones", '''
def my_generate(engine, prompts, params):
    for i, (p, sp) in enumerate(zip(prompts, params)):
        engine.add_request(f"ex{i}", p, sp)
    done = {}
    while engine.has_unfinished_requests():
        for o in engine.step():
            done.setdefault(o.request_id, o)
    return [done[f"ex{i}"] for i in range(len(prompts))]
'''),
    ],
    ("13_llm", "my_params_list"): [
        ("a short list is padded with the default", '''
def my_params_list(n, sampling_params, default):
    if sampling_params is None:
        sampling_params = default
    if isinstance(sampling_params, SamplingParams):
        return [sampling_params] * n
    return list(sampling_params) + [default] * (n - len(sampling_params))
'''),
        ("None gives an empty list", '''
def my_params_list(n, sampling_params, default):
    if sampling_params is None:
        return []
    if isinstance(sampling_params, SamplingParams):
        return [sampling_params] * n
    if len(sampling_params) != n:
        raise ValueError(f"got {n} prompts but {len(sampling_params)} sampling_params")
    return list(sampling_params)
'''),
        ("one SamplingParams is returned once", '''
def my_params_list(n, sampling_params, default):
    if sampling_params is None:
        sampling_params = default
    if isinstance(sampling_params, SamplingParams):
        return [sampling_params]
    if len(sampling_params) != n:
        raise ValueError(f"got {n} prompts but {len(sampling_params)} sampling_params")
    return list(sampling_params)
'''),
    ],
    ("05d_sliding_window", "my_num_dropped"): [
        ("the window one token too short (first = computed - window)", '''
def my_num_dropped(num_computed, window, block_size):
    first = max(num_computed - window, 0)
    return first // block_size
'''),
        ("rounds up: a block still partly visible is dropped", '''
def my_num_dropped(num_computed, window, block_size):
    first = max(num_computed - window + 1, 0)
    return -(-first // block_size)
'''),
        ("counts in whole blocks of the window", '''
def my_num_dropped(num_computed, window, block_size):
    return max(num_computed // block_size - window // block_size, 0)
'''),
    ],
    ("05d_sliding_window", "my_window_mask"): [
        ("one key too many (t >= p - window)", '''
def my_window_mask(q_len, kv_len, window):
    pos = torch.arange(kv_len - q_len, kv_len)[:, None]
    t = torch.arange(kv_len)[None]
    return (t <= pos) & (t >= pos - window)
'''),
        ("not causal: keys after the query seen", '''
def my_window_mask(q_len, kv_len, window):
    pos = torch.arange(kv_len - q_len, kv_len)[:, None]
    t = torch.arange(kv_len)[None]
    return t > pos - window
'''),
        ("the queries' positions counted from 0", '''
def my_window_mask(q_len, kv_len, window):
    pos = torch.arange(q_len)[:, None]
    t = torch.arange(kv_len)[None]
    return (t <= pos) & (t > pos - window)
'''),
    ],
    ("07d_moe", "my_route"): [
        ("no renormalisation", '''
def my_route(logits, k):
    probs = torch.softmax(logits.float(), -1)
    return torch.topk(probs, k, -1)
'''),
        ("the softmax over the tokens, not the experts", '''
def my_route(logits, k):
    probs = torch.softmax(logits.float(), 0)
    w, ids = torch.topk(probs, k, -1)
    return w / w.sum(-1, keepdim=True), ids
'''),
        ("the raw logits as weights", '''
def my_route(logits, k):
    w, ids = torch.topk(logits.float(), k, -1)
    return w / w.sum(-1, keepdim=True), ids
'''),
        ("the k least likely experts", '''
def my_route(logits, k):
    probs = torch.softmax(logits.float(), -1)
    w, ids = torch.topk(probs, k, -1, largest=False)
    return w / w.sum(-1, keepdim=True), ids
'''),
    ],
    ("07d_moe", "my_groups"): [
        ("the flat (token, slot) positions instead of the tokens", '''
def my_groups(ids, num_experts):
    order = torch.argsort(ids.flatten(), stable=True)
    counts = torch.bincount(ids.flatten(), minlength=num_experts).tolist()
    tokens = order.tolist()
    out, start = [], 0
    for n in counts:
        out.append(sorted(tokens[start : start + n]))
        start += n
    return out
'''),
        ("experts no token chose are left out", '''
def my_groups(ids, num_experts):
    order = torch.argsort(ids.flatten(), stable=True)
    counts = torch.bincount(ids.flatten()).tolist()
    tokens = (order // ids.shape[1]).tolist()
    out, start = [], 0
    for n in counts:
        out.append(sorted(tokens[start : start + n]))
        start += n
    return out
'''),
        ("divides by the number of experts, not by k", '''
def my_groups(ids, num_experts):
    order = torch.argsort(ids.flatten(), stable=True)
    counts = torch.bincount(ids.flatten(), minlength=num_experts).tolist()
    tokens = (order // num_experts).tolist()
    out, start = [], 0
    for n in counts:
        out.append(sorted(tokens[start : start + n]))
        start += n
    return out
'''),
        ("only each token's first expert", '''
def my_groups(ids, num_experts):
    return [[t for t in range(ids.shape[0]) if ids[t, 0] == e] for e in range(num_experts)]
'''),
    ],
    ("07e_gemma_phi", "my_softcap"): [
        ("a hard clamp", '''
def my_softcap(x, cap):
    return x.clamp(-cap, cap)
'''),
        ("tanh of the unscaled scores", '''
def my_softcap(x, cap):
    return cap * torch.tanh(x)
'''),
        ("not scaled back by the cap", '''
def my_softcap(x, cap):
    return torch.tanh(x / cap)
'''),
        ("a sigmoid (not odd: negative scores pushed up)", '''
def my_softcap(x, cap):
    return cap * torch.sigmoid(x / cap)
'''),
    ],
    ("07e_gemma_phi", "my_unfuse_qkv"): [
        ("k and v as large as q", '''
def my_unfuse_qkv(w, num_heads, num_kv_heads, head_dim):
    q = num_heads * head_dim
    return w[:q], w[q : 2 * q], w[2 * q :]
'''),
        ("cut in three equal parts", '''
def my_unfuse_qkv(w, num_heads, num_kv_heads, head_dim):
    n = w.shape[0] // 3
    return w[:n], w[n : 2 * n], w[2 * n :]
'''),
        ("the keys taken first", '''
def my_unfuse_qkv(w, num_heads, num_kv_heads, head_dim):
    q, kv = num_heads * head_dim, num_kv_heads * head_dim
    return w[kv : kv + q], w[:kv], w[q + kv :]
'''),
    ],
    ("15_server", "my_key_ok"): [
        ("the scheme compared case-sensitively", '''
def my_key_ok(header: str, api_key: str) -> bool:
    scheme, _, token = header.partition(" ")
    return scheme == "Bearer" and secrets.compare_digest(token.strip().encode(), api_key.encode())
'''),
        ("the key anywhere in the header", '''
def my_key_ok(header: str, api_key: str) -> bool:
    return api_key in header
'''),
        ("the header only has to end with the key", '''
def my_key_ok(header: str, api_key: str) -> bool:
    return header.lower().startswith("bearer") and header.endswith(api_key)
'''),
        ("a token that starts with the key is enough", '''
def my_key_ok(header: str, api_key: str) -> bool:
    scheme, _, token = header.partition(" ")
    return scheme.lower() == "bearer" and token.strip().startswith(api_key)
'''),
    ],
    ("15_server", "my_sse_body"): [
        ("one newline after each event, not a blank line", '''
def my_sse_body(chunks: list[dict]) -> str:
    return "".join(f"data: {json.dumps(c)}\\n" for c in chunks) + "data: [DONE]\\n"
'''),
        ("no [DONE] at the end", '''
def my_sse_body(chunks: list[dict]) -> str:
    return "".join(f"data: {json.dumps(c)}\\n\\n" for c in chunks)
'''),
        ("the chunk as Python's repr, not JSON", '''
def my_sse_body(chunks: list[dict]) -> str:
    return "".join(f"data: {c}\\n\\n" for c in chunks) + "data: [DONE]\\n\\n"
'''),
        ("pretty-printed JSON, over several lines", '''
def my_sse_body(chunks: list[dict]) -> str:
    return "".join(f"data: {json.dumps(c, indent=2)}\\n\\n" for c in chunks) + "data: [DONE]\\n\\n"
'''),
        ("[DONE] sent as a JSON string", '''
def my_sse_body(chunks: list[dict]) -> str:
    return "".join(f"data: {json.dumps(c)}\\n\\n" for c in chunks) + 'data: "[DONE]"\\n\\n'
'''),
    ],
    ("16_benchmarks", "my_round_ratios"): [
        ("the ratio of the medians, not the median of the ratios", '''
def my_round_ratios(runs, base="minivllm"):
    values = {}
    for system, r, value in runs:
        values.setdefault(system, []).append(value)
    b = statistics.median(values[base])
    return {s: b / statistics.median(xs) for s, xs in values.items() if s != base}
'''),
        ("every pair of runs, not runs of the same round", '''
def my_round_ratios(runs, base="minivllm"):
    ratios = {}
    for s, _, v in runs:
        if s != base:
            ratios.setdefault(s, []).extend(bv / v for bs, _, bv in runs if bs == base)
    return {s: statistics.median(xs) for s, xs in ratios.items()}
'''),
        ("the mean of the round ratios", '''
def my_round_ratios(runs, base="minivllm"):
    by_round = {}
    for system, r, value in runs:
        by_round.setdefault(r, {})[system] = value
    ratios = {}
    for values in by_round.values():
        if base in values:
            for system, value in values.items():
                if system != base:
                    ratios.setdefault(system, []).append(values[base] / value)
    return {system: statistics.mean(xs) for system, xs in ratios.items()}
'''),
        ("the other system over the base", '''
def my_round_ratios(runs, base="minivllm"):
    by_round = {}
    for system, r, value in runs:
        by_round.setdefault(r, {})[system] = value
    ratios = {}
    for values in by_round.values():
        if base in values:
            for system, value in values.items():
                if system != base:
                    ratios.setdefault(system, []).append(value / values[base])
    return {system: statistics.median(xs) for system, xs in ratios.items()}
'''),
        ("the base is always minivllm", '''
def my_round_ratios(runs, base="minivllm"):
    by_round = {}
    for system, r, value in runs:
        by_round.setdefault(r, {})[system] = value
    ratios = {}
    for values in by_round.values():
        if "minivllm" in values:
            for system, value in values.items():
                if system != "minivllm":
                    ratios.setdefault(system, []).append(values["minivllm"] / value)
    return {system: statistics.median(xs) for system, xs in ratios.items()}
'''),
    ],
    ("00f_engine_args", "my_token_budget"): [
        ("without chunked prefill, max_model_len even when it is under 2048", '''
def my_token_budget(max_num_batched_tokens, enable_chunked_prefill, max_model_len):
    budget = max_num_batched_tokens or (2048 if enable_chunked_prefill else max_model_len)
    if not enable_chunked_prefill and budget < max_model_len:
        raise ValueError("max_num_batched_tokens must be at least max_model_len")
    return budget
'''),
        ("2048 by default, chunked prefill or not", '''
def my_token_budget(max_num_batched_tokens, enable_chunked_prefill, max_model_len):
    budget = max_num_batched_tokens or 2048
    if not enable_chunked_prefill and budget < max_model_len:
        raise ValueError("max_num_batched_tokens must be at least max_model_len")
    return budget
'''),
        ("a budget too small for a prompt is not refused", '''
def my_token_budget(max_num_batched_tokens, enable_chunked_prefill, max_model_len):
    return max_num_batched_tokens or (2048 if enable_chunked_prefill else max(max_model_len, 2048))
'''),
        ("refused below max_model_len with chunked prefill too", '''
def my_token_budget(max_num_batched_tokens, enable_chunked_prefill, max_model_len):
    budget = max_num_batched_tokens or (2048 if enable_chunked_prefill else max(max_model_len, 2048))
    if budget < max_model_len:
        raise ValueError("max_num_batched_tokens must be at least max_model_len")
    return budget
'''),
        ("a budget equal to max_model_len refused", '''
def my_token_budget(max_num_batched_tokens, enable_chunked_prefill, max_model_len):
    budget = max_num_batched_tokens or (2048 if enable_chunked_prefill else max(max_model_len, 2048))
    if not enable_chunked_prefill and budget <= max_model_len:
        raise ValueError("max_num_batched_tokens must be at least max_model_len")
    return budget
'''),
    ],
    ("04c_attention_kernels", "my_merge"): [
        ("the parts added without rescaling to the common maximum", '''
def my_merge(m1, l1, acc1, m2, l2, acc2):
    return torch.maximum(m1, m2), l1 + l2, acc1 + acc2
'''),
        ("the sums rescaled, the accumulators not", '''
def my_merge(m1, l1, acc1, m2, l2, acc2):
    m = torch.maximum(m1, m2)
    w1, w2 = torch.exp(m1 - m), torch.exp(m2 - m)
    return m, l1 * w1 + l2 * w2, acc1 + acc2
'''),
        ("the weights inverted: exp(m - m_i)", '''
def my_merge(m1, l1, acc1, m2, l2, acc2):
    m = torch.maximum(m1, m2)
    w1, w2 = torch.exp(m - m1), torch.exp(m - m2)
    return m, l1 * w1 + l2 * w2, acc1 * w1 + acc2 * w2
'''),
        ("only the part with the larger maximum kept", '''
def my_merge(m1, l1, acc1, m2, l2, acc2):
    return (m1, l1, acc1) if m1 >= m2 else (m2, l2, acc2)
'''),
        ("the two normalised outputs averaged", '''
def my_merge(m1, l1, acc1, m2, l2, acc2):
    return torch.maximum(m1, m2), torch.tensor(2.0), acc1 / l1 + acc2 / l2
'''),
    ],
    ("95_vllm_compat", "my_accepted"): [
        ("`in`: 0 taken for False and True for 1", '''
def my_accepted(name, value, table):
    if name not in table:
        raise TypeError(f"{name!r} is not one of vLLM's engine arguments.")
    ok = table[name]
    return ok in ("any value", "any bool") or value in ok
'''),
        ("an unknown name refused, not a TypeError", '''
def my_accepted(name, value, table):
    ok = table.get(name, ())
    if ok in ("any value", "any bool"):
        return True
    return any(value == o and isinstance(value, bool) == isinstance(o, bool) for o in ok)
'''),
        ('"any bool" read as a tuple of accepted values', '''
def my_accepted(name, value, table):
    if name not in table:
        raise TypeError(f"{name!r} is not one of vLLM's engine arguments.")
    ok = table[name]
    if ok == "any value":
        return True
    return any(value == o and isinstance(value, bool) == isinstance(o, bool) for o in ok)
'''),
        ("only the type compared, not the value", '''
def my_accepted(name, value, table):
    if name not in table:
        raise TypeError(f"{name!r} is not one of vLLM's engine arguments.")
    ok = table[name]
    if ok in ("any value", "any bool"):
        return True
    return any(type(value) is type(o) for o in ok)
'''),
        ("the first accepted value only", '''
def my_accepted(name, value, table):
    if name not in table:
        raise TypeError(f"{name!r} is not one of vLLM's engine arguments.")
    ok = table[name]
    if ok in ("any value", "any bool"):
        return True
    return value == ok[0] and isinstance(value, bool) == isinstance(ok[0], bool)
'''),
    ],
    ("13b_llm_more", "my_next_logprobs"): [
        ("the whole list of logprob dicts, not the first token's dict", '''
def my_next_logprobs(llm, seqs, k, temperature):
    sp = SamplingParams(logprobs=k, max_tokens=1, temperature=temperature)
    outs = llm.generate([TokensPrompt(prompt_token_ids=s) for s in seqs], sp, use_tqdm=False)
    return [o.outputs[0].logprobs for o in outs]
'''),
        ("the logprobs as floats, not Logprob records", '''
def my_next_logprobs(llm, seqs, k, temperature):
    sp = SamplingParams(logprobs=k, max_tokens=1, temperature=temperature)
    outs = llm.generate([TokensPrompt(prompt_token_ids=s) for s in seqs], sp, use_tqdm=False)
    return [{t: lp.logprob for t, lp in o.outputs[0].logprobs[0].items()} for o in outs]
'''),
        ("one logprob asked for, whatever k", '''
def my_next_logprobs(llm, seqs, k, temperature):
    sp = SamplingParams(logprobs=1, max_tokens=1, temperature=temperature)
    outs = llm.generate([TokensPrompt(prompt_token_ids=s) for s in seqs], sp, use_tqdm=False)
    return [o.outputs[0].logprobs[0] for o in outs]
'''),
        ("the prompt's last token's logprobs (prompt_logprobs), not the next token's", '''
def my_next_logprobs(llm, seqs, k, temperature):
    sp = SamplingParams(prompt_logprobs=k, max_tokens=1, temperature=temperature)
    outs = llm.generate([TokensPrompt(prompt_token_ids=s) for s in seqs], sp, use_tqdm=False)
    return [o.prompt_logprobs[-1] for o in outs]
'''),
    ],
    ("14_async_engine", "my_run_ops"): [
        ("an exception raised, not handed to its done: the loop stops", '''
def my_run_ops(ops):
    while ops:
        fn, done = ops.popleft()
        res = fn()
        if done is not None:
            done(True, res)
'''),
        ("the newest operation first (pop, not popleft)", '''
def my_run_ops(ops):
    while ops:
        fn, done = ops.pop()
        try:
            res, ok = fn(), True
        except Exception as e:
            res, ok = e, False
        if done is not None:
            done(ok, res)
'''),
        ("the queue as it was: an operation queued meanwhile is dropped", '''
def my_run_ops(ops):
    for fn, done in list(ops):
        try:
            res, ok = fn(), True
        except Exception as e:
            res, ok = e, False
        if done is not None:
            done(ok, res)
    ops.clear()
'''),
        ("done told only of results, not of exceptions", '''
def my_run_ops(ops):
    while ops:
        fn, done = ops.popleft()
        try:
            res = fn()
        except Exception:
            continue
        if done is not None:
            done(True, res)
'''),
        ("done called even when there is none", '''
def my_run_ops(ops):
    while ops:
        fn, done = ops.popleft()
        try:
            res, ok = fn(), True
        except Exception as e:
            res, ok = e, False
        done(ok, res)
'''),
    ],
    ("07_tensor_parallel", "my_head_split"): [
        ("the query heads split evenly, not whole KV groups", '''
def my_head_split(num_heads, num_kv_heads, world_size):
    q = [num_heads // world_size + (r < num_heads % world_size) for r in range(world_size)]
    kv = [num_kv_heads // world_size + (r < num_kv_heads % world_size) for r in range(world_size)]
    return q, kv
'''),
        ("the extra KV group on the last ranks", '''
def my_head_split(num_heads, num_kv_heads, world_size):
    group = num_heads // num_kv_heads
    extra = num_kv_heads % world_size
    kv = [num_kv_heads // world_size + (r >= world_size - extra) for r in range(world_size)]
    return [k * group for k in kv], kv
'''),
        ("the remainder all on the last rank", '''
def my_head_split(num_heads, num_kv_heads, world_size):
    group = num_heads // num_kv_heads
    kv = [num_kv_heads // world_size] * world_size
    kv[-1] += num_kv_heads % world_size
    return [k * group for k in kv], kv
'''),
        ("a KV head counted as one query head", '''
def my_head_split(num_heads, num_kv_heads, world_size):
    kv = [num_kv_heads // world_size + (r < num_kv_heads % world_size) for r in range(world_size)]
    return [k + num_heads // world_size - num_kv_heads // world_size for k in kv], kv
'''),
    ],
    ("06a_sampling_more", "my_answer_logprob"): [
        ("the greedy reply's logprob, not the given answer's (no trace)", '''
def my_answer_logprob(llm, prompt_ids, answer_ids):
    sp = SamplingParams(temperature=0, max_tokens=len(answer_ids), logprobs=0)
    out = llm.generate({"prompt_token_ids": prompt_ids}, sp, use_tqdm=False)[0].outputs[0]
    return sum(d[t].logprob for d, t in zip(out.logprobs, out.token_ids))
'''),
        ("the last token's logprob only", '''
def my_answer_logprob(llm, prompt_ids, answer_ids):
    sp = SamplingParams(temperature=0, trace_decode_token_ids=answer_ids, logprobs=0)
    out = llm.generate({"prompt_token_ids": prompt_ids}, sp, use_tqdm=False)[0].outputs[0]
    return out.logprobs[-1][answer_ids[-1]].logprob
'''),
        ("the mean logprob per token, not the sum", '''
def my_answer_logprob(llm, prompt_ids, answer_ids):
    sp = SamplingParams(temperature=0, trace_decode_token_ids=answer_ids, logprobs=0)
    out = llm.generate({"prompt_token_ids": prompt_ids}, sp, use_tqdm=False)[0].outputs[0]
    return sum(d[t].logprob for d, t in zip(out.logprobs, answer_ids)) / len(answer_ids)
'''),
        ("the answer cut at its EOS (a plain prompt continued token by token stops there)", '''
def my_answer_logprob(llm, prompt_ids, answer_ids):
    eos = llm.llm_engine.processor.eos_token_id
    ids = answer_ids[: answer_ids.index(eos)] if eos in answer_ids else answer_ids
    sp = SamplingParams(temperature=0, trace_decode_token_ids=ids, logprobs=0)
    out = llm.generate({"prompt_token_ids": prompt_ids}, sp, use_tqdm=False)[0].outputs[0]
    return sum(d[t].logprob for d, t in zip(out.logprobs, ids))
'''),
    ],
    ("09b_pooling", "my_pool_chunks"): [
        ("the mean of the chunks' means, whatever their sizes", '''
def my_pool_chunks(chunks, kind):
    if kind == "MEAN":
        return torch.stack([rows.mean(0) for rows in chunks]).mean(0)
    return chunks[0][0] if kind == "CLS" else chunks[-1][-1]
'''),
        ("the running sum divided by the number of chunks, not of rows", '''
def my_pool_chunks(chunks, kind):
    acc = None
    for rows in chunks:
        if kind == "MEAN":
            acc = rows.sum(0) if acc is None else acc + rows.sum(0)
        elif kind == "CLS":
            acc = rows[0] if acc is None else acc
        else:
            acc = rows[-1]
    return acc / len(chunks) if kind == "MEAN" else acc
'''),
        ("CLS: each chunk's first row, the last one kept", '''
def my_pool_chunks(chunks, kind):
    acc, n = None, 0
    for rows in chunks:
        if kind == "MEAN":
            acc = rows.sum(0) if acc is None else acc + rows.sum(0)
        elif kind == "CLS":
            acc = rows[0]
        else:
            acc = rows[-1]
        n += len(rows)
    return acc / n if kind == "MEAN" else acc
'''),
        ("LAST: the first chunk's last row", '''
def my_pool_chunks(chunks, kind):
    acc, n = None, 0
    for rows in chunks:
        if kind == "MEAN":
            acc = rows.sum(0) if acc is None else acc + rows.sum(0)
        elif acc is None:
            acc = rows[0] if kind == "CLS" else rows[-1]
        n += len(rows)
    return acc / n if kind == "MEAN" else acc
'''),
    ],
    ("06b_structured_outputs", "my_bitmask"): [
        ("the highest bit first: token t at bit 31 - t % 32", '''
def my_bitmask(allowed, vocab_size):
    words = [0] * ((vocab_size + 31) // 32)
    for t in allowed:
        words[t // 32] |= 1 << (31 - t % 32)
    return torch.tensor([w - 2**32 if w >= 2**31 else w for w in words], dtype=torch.int32)
'''),
        ("one word too few when the vocabulary is not a multiple of 32", '''
def my_bitmask(allowed, vocab_size):
    words = [0] * (vocab_size // 32)
    for t in allowed:
        words[t // 32] |= 1 << (t % 32)
    return torch.tensor([w - 2**32 if w >= 2**31 else w for w in words], dtype=torch.int32)
'''),
        ("bit 31 kept unsigned: a word of 2**31 or more does not fit an int32", '''
def my_bitmask(allowed, vocab_size):
    words = [0] * ((vocab_size + 31) // 32)
    for t in allowed:
        words[t // 32] |= 1 << (t % 32)
    return torch.tensor(words, dtype=torch.int32)
'''),
        ("tokens spread over the words by t % W, not t // 32", '''
def my_bitmask(allowed, vocab_size):
    words = [0] * ((vocab_size + 31) // 32)
    for t in allowed:
        words[t % len(words)] |= 1 << (t % 32)
    return torch.tensor([w - 2**32 if w >= 2**31 else w for w in words], dtype=torch.int32)
'''),
    ],
    ("04a_cpu_gemm", "my_packed_matmul"): [
        ("the packed weight read as if it were [N, K]", '''
def my_packed_matmul(x, p):
    return x.float() @ p.float().reshape(-1, x.shape[1]).T
'''),
        ("x viewed with the position in K as the slow index ([M, KU, K/KU])", '''
def my_packed_matmul(x, p):
    blocks, steps, lanes, ku = p.shape
    xs = x.float().reshape(len(x), ku, steps).transpose(1, 2)
    return torch.einsum("mku,bkiu->mbi", xs, p.float()).reshape(len(x), blocks * lanes)
'''),
        ("output columns lane-major (lane · blocks + block, not block · 16 + lane)", '''
def my_packed_matmul(x, p):
    blocks, steps, lanes, ku = p.shape
    xs = x.float().reshape(len(x), steps, ku)
    return torch.einsum("mku,bkiu->mib", xs, p.float()).reshape(len(x), blocks * lanes)
'''),
        ("only the first position of each step of K summed", '''
def my_packed_matmul(x, p):
    blocks, steps, lanes, ku = p.shape
    xs = x.float().reshape(len(x), steps, ku)
    return torch.einsum("mk,bki->mbi", xs[..., 0], p.float()[..., 0]).reshape(len(x), blocks * lanes)
'''),
    ],
    ("04b_quantization", "my_dequantize_q4_0"): [
        ("codes interleaved (byte j holding codes 2j and 2j + 1)", '''
def my_dequantize_q4_0(rows):
    blocks = rows.reshape(len(rows), -1, 18)
    d = blocks[..., :2].contiguous().view(torch.float16).float()
    codes = blocks[..., 2:].to(torch.int32)
    q = torch.stack([codes & 0xF, codes >> 4], dim=-1).reshape(len(rows), -1, 32)
    return (d * (q - 8)).reshape(len(rows), -1)
'''),
        ("no offset of 8 (the codes taken as the weights' multiples)", '''
def my_dequantize_q4_0(rows):
    blocks = rows.reshape(len(rows), -1, 18)
    d = blocks[..., :2].contiguous().view(torch.float16).float()
    codes = blocks[..., 2:].to(torch.int32)
    q = torch.cat([codes & 0xF, codes >> 4], dim=-1)
    return (d * q).reshape(len(rows), -1)
'''),
        ("high nibbles first", '''
def my_dequantize_q4_0(rows):
    blocks = rows.reshape(len(rows), -1, 18)
    d = blocks[..., :2].contiguous().view(torch.float16).float()
    codes = blocks[..., 2:].to(torch.int32)
    q = torch.cat([codes >> 4, codes & 0xF], dim=-1)
    return (d * (q - 8)).reshape(len(rows), -1)
'''),
        ("the scale's two bytes read big-endian", '''
def my_dequantize_q4_0(rows):
    blocks = rows.reshape(len(rows), -1, 18)
    d = blocks[..., [1, 0]].contiguous().view(torch.float16).float()
    codes = blocks[..., 2:].to(torch.int32)
    q = torch.cat([codes & 0xF, codes >> 4], dim=-1)
    return (d * (q - 8)).reshape(len(rows), -1)
'''),
    ],
    ("05c_lora", "my_merged_weight"): [
        ("the scale lora_alpha, not divided by the rank", '''
def my_merged_weight(w, a, b, lora_alpha, use_rslora=False):
    return w + lora_alpha * (b @ a)
'''),
        ("rsLoRA ignored (always lora_alpha / r)", '''
def my_merged_weight(w, a, b, lora_alpha, use_rslora=False):
    return w + lora_alpha / a.shape[0] * (b @ a)
'''),
        ("the scale inverted (r / lora_alpha)", '''
def my_merged_weight(w, a, b, lora_alpha, use_rslora=False):
    r = a.shape[0]
    s = math.sqrt(r) / lora_alpha if use_rslora else r / lora_alpha
    return w + s * (b @ a)
'''),
        ("the rank read from b's rows (the output size), not a's", '''
def my_merged_weight(w, a, b, lora_alpha, use_rslora=False):
    r = b.shape[0]
    s = lora_alpha / math.sqrt(r) if use_rslora else lora_alpha / r
    return w + s * (b @ a)
'''),
    ],
    ("07b_spec_decode", "my_recovered"): [
        ("q − p instead of p − q", '''
def my_recovered(p, q):
    resid = (q - p).clamp_min(0)
    return resid / resid.sum(-1, keepdim=True)
'''),
        ("not normalized (Z · r, not r)", '''
def my_recovered(p, q):
    return (p - q).clamp_min(0)
'''),
        ("normalized over the batch, not over each row", '''
def my_recovered(p, q):
    resid = (p - q).clamp_min(0)
    return resid / resid.sum(0, keepdim=True)
'''),
        ("p − q not clamped at zero", '''
def my_recovered(p, q):
    resid = p - q
    return resid / resid.abs().sum(-1, keepdim=True)
'''),
        ("p renormalized with q's tokens dropped wherever q > 0", '''
def my_recovered(p, q):
    resid = torch.where(q > 0, torch.zeros_like(p), p)
    return resid / resid.sum(-1, keepdim=True)
'''),
    ],
    ("05a_model_kernels", "my_row_bucket"): [
        ("rounded down, not up", '''
def my_row_bucket(m):
    if m <= 16:
        return m
    step = 1 << ((m - 1).bit_length() - 4)
    return max(16, m // step * step)
'''),
        ("sixteen sizes per doubling", '''
def my_row_bucket(m):
    if m <= 16:
        return m
    step = 1 << ((m - 1).bit_length() - 5)
    return -(-m // step) * step
'''),
        ("the next power of two", '''
def my_row_bucket(m):
    return m if m <= 16 else 1 << (m - 1).bit_length()
'''),
        ("a fixed step of 2 above 16 (not 8 sizes per doubling)", '''
def my_row_bucket(m):
    return m if m <= 16 else -(-m // 2) * 2
'''),
    ],
    ("05b_compile", "my_padded_size"): [
        ("the first size in the list's order that holds the step, not the smallest", '''
def my_padded_size(n, sizes, least=2):
    need = max(n, least)
    return next((s for s in sizes if s >= need), need)
'''),
        ("least ignored", '''
def my_padded_size(n, sizes, least=2):
    return min((s for s in sizes if s >= n), default=n)
'''),
        ("beyond the largest size, the largest size", '''
def my_padded_size(n, sizes, least=2):
    need = max(n, least)
    return min((s for s in sizes if s >= need), default=max(sizes))
'''),
        ("the largest size at or below the step", '''
def my_padded_size(n, sizes, least=2):
    need = max(n, least)
    return max((s for s in sizes if s <= need), default=need)
'''),
    ],
    ("08b_prompt_embeds", "my_embed_rows"): [
        ("the chunk's rows matched to the prompt's first vectors (start ignored)", '''
def my_embed_rows(chunks, query_start_loc):
    out = []
    for (start, num_tokens, embeds), first in zip(chunks, query_start_loc):
        if embeds is None:
            continue
        for j in range(num_tokens):
            pos = start + j
            if pos < len(embeds) and not embeds[pos].isnan().any():
                out.append((first + j, embeds[j]))
    return out
'''),
        ('NaN rows written too', '''
def my_embed_rows(chunks, query_start_loc):
    out = []
    for (start, num_tokens, embeds), first in zip(chunks, query_start_loc):
        if embeds is None:
            continue
        for j in range(num_tokens):
            pos = start + j
            if pos < len(embeds):
                out.append((first + j, embeds[pos]))
    return out
'''),
        ('rows numbered within the chunk, not within the flat batch', '''
def my_embed_rows(chunks, query_start_loc):
    out = []
    for (start, num_tokens, embeds), first in zip(chunks, query_start_loc):
        if embeds is None:
            continue
        for j in range(num_tokens):
            pos = start + j
            if pos < len(embeds) and not embeds[pos].isnan().any():
                out.append((j, embeds[pos]))
    return out
'''),
        ('rows past the prompt given the last vector (decodes overwritten)', '''
def my_embed_rows(chunks, query_start_loc):
    out = []
    for (start, num_tokens, embeds), first in zip(chunks, query_start_loc):
        if embeds is None:
            continue
        for j in range(num_tokens):
            pos = start + j
            pos = min(pos, len(embeds) - 1)
            if not embeds[pos].isnan().any():
                out.append((first + j, embeds[pos]))
    return out
'''),
    ],
    ("10_output_processor", "my_find_stop"): [
        ("searched in the new characters only (a stop string across the boundary missed)", '''
def my_find_stop(text, num_new_chars, stops, include):
    if not num_new_chars:
        return None
    for stop in stops:
        i = text.find(stop, len(text) - num_new_chars)
        if i != -1:
            return stop, i + len(stop) if include else i
    return None
'''),
        ("searched in the whole text (an old stop string found again)", '''
def my_find_stop(text, num_new_chars, stops, include):
    if not num_new_chars:
        return None
    for stop in stops:
        i = text.find(stop)
        if i != -1:
            return stop, i + len(stop) if include else i
    return None
'''),
        ("include ignored: always cut before the stop string", '''
def my_find_stop(text, num_new_chars, stops, include):
    if not num_new_chars:
        return None
    for stop in stops:
        i = text.find(stop, max(0, len(text) - num_new_chars - len(stop) + 1))
        if i != -1:
            return stop, i
    return None
'''),
        ("the earliest stop string in the text, not the first of `stops`", '''
def my_find_stop(text, num_new_chars, stops, include):
    if not num_new_chars:
        return None
    found = []
    for stop in stops:
        i = text.find(stop, max(0, len(text) - num_new_chars - len(stop) + 1))
        if i != -1:
            found.append((i, stop))
    if not found:
        return None
    i, stop = min(found)
    return stop, i + len(stop) if include else i
'''),
        ("the window one character too early (a stop string ending just before the new text)", '''
def my_find_stop(text, num_new_chars, stops, include):
    if not num_new_chars:
        return None
    for stop in stops:
        i = text.find(stop, max(0, len(text) - num_new_chars - len(stop)))
        if i != -1:
            return stop, i + len(stop) if include else i
    return None
'''),
    ],
    ("06c_tool_calling", "my_hermes"): [
        ('malformed calls skipped instead of making the reply content', r'''
def my_hermes(text):
    if "<tool_call>" not in text:
        return text, []
    bodies = re.findall(r"<tool_call>(.*?)</tool_call>|<tool_call>(.*)", text, re.DOTALL)
    calls = []
    for closed, unclosed in bodies:
        try:
            obj = json.loads(closed or unclosed)
        except json.JSONDecodeError:
            return text, []
        for call in obj if isinstance(obj, list) else [obj]:
            if not isinstance(call, dict) or not isinstance(call.get("name"), str):
                continue
            if not isinstance(call.get("arguments"), dict):
                continue
            calls.append((call["name"], call["arguments"]))
    if not calls:
        return text, []
    content = text[: text.find("<tool_call>")]
    return (content if content.strip() else None), calls
'''),
        ('an unclosed last call ignored', r'''
def my_hermes(text):
    if "<tool_call>" not in text:
        return text, []
    bodies = [(b, "") for b in re.findall(r"<tool_call>(.*?)</tool_call>", text, re.DOTALL)]
    calls = []
    for closed, unclosed in bodies:
        try:
            obj = json.loads(closed or unclosed)
        except json.JSONDecodeError:
            return text, []
        for call in obj if isinstance(obj, list) else [obj]:
            if not isinstance(call, dict) or not isinstance(call.get("name"), str):
                return text, []
            if not isinstance(call.get("arguments"), dict):
                return text, []
            calls.append((call["name"], call["arguments"]))
    if not calls:
        return text, []
    content = text[: text.find("<tool_call>")]
    return (content if content.strip() else None), calls
'''),
        ('whitespace-only content kept as content (not None)', r'''
def my_hermes(text):
    if "<tool_call>" not in text:
        return text, []
    bodies = re.findall(r"<tool_call>(.*?)</tool_call>|<tool_call>(.*)", text, re.DOTALL)
    calls = []
    for closed, unclosed in bodies:
        try:
            obj = json.loads(closed or unclosed)
        except json.JSONDecodeError:
            return text, []
        for call in obj if isinstance(obj, list) else [obj]:
            if not isinstance(call, dict) or not isinstance(call.get("name"), str):
                return text, []
            if not isinstance(call.get("arguments"), dict):
                return text, []
            calls.append((call["name"], call["arguments"]))
    if not calls:
        return text, []
    content = text[: text.find("<tool_call>")]
    return (content or None), calls
'''),
        ('the content is the text outside the calls, not the text before the first', r'''
def my_hermes(text):
    if "<tool_call>" not in text:
        return text, []
    bodies = re.findall(r"<tool_call>(.*?)</tool_call>|<tool_call>(.*)", text, re.DOTALL)
    calls = []
    for closed, unclosed in bodies:
        try:
            obj = json.loads(closed or unclosed)
        except json.JSONDecodeError:
            return text, []
        for call in obj if isinstance(obj, list) else [obj]:
            if not isinstance(call, dict) or not isinstance(call.get("name"), str):
                return text, []
            if not isinstance(call.get("arguments"), dict):
                return text, []
            calls.append((call["name"], call["arguments"]))
    if not calls:
        return text, []
    content = re.sub(r"<tool_call>.*?(</tool_call>|$)", "", text, flags=re.DOTALL)
    return (content if content.strip() else None), calls
'''),
        ('a list of calls in one tag not read', r'''
def my_hermes(text):
    if "<tool_call>" not in text:
        return text, []
    bodies = re.findall(r"<tool_call>(.*?)</tool_call>|<tool_call>(.*)", text, re.DOTALL)
    calls = []
    for closed, unclosed in bodies:
        try:
            obj = json.loads(closed or unclosed)
        except json.JSONDecodeError:
            return text, []
        for call in [obj]:
            if not isinstance(call, dict) or not isinstance(call.get("name"), str):
                return text, []
            if not isinstance(call.get("arguments"), dict):
                return text, []
            calls.append((call["name"], call["arguments"]))
    if not calls:
        return text, []
    content = text[: text.find("<tool_call>")]
    return (content if content.strip() else None), calls
'''),
        ('a greedy regex (the bodies of several calls run together)', r'''
def my_hermes(text):
    if "<tool_call>" not in text:
        return text, []
    bodies = re.findall(r"<tool_call>(.*)</tool_call>|<tool_call>(.*)", text, re.DOTALL)
    calls = []
    for closed, unclosed in bodies:
        try:
            obj = json.loads(closed or unclosed)
        except json.JSONDecodeError:
            return text, []
        for call in obj if isinstance(obj, list) else [obj]:
            if not isinstance(call, dict) or not isinstance(call.get("name"), str):
                return text, []
            if not isinstance(call.get("arguments"), dict):
                return text, []
            calls.append((call["name"], call["arguments"]))
    if not calls:
        return text, []
    content = text[: text.find("<tool_call>")]
    return (content if content.strip() else None), calls
'''),
    ],
    ("06d_logits_processors", "my_dict_updates"): [
        ('moves applied before the removals and additions', '''
def my_dict_updates(entries, batch_update, new_state):
    if not batch_update:
        return False
    changed = False
    for a, b, how in batch_update.moved:
        at_a, at_b = entries.pop(a, None), entries.pop(b, None)
        if at_a is not None:
            entries[b] = at_a
        if at_b is not None and how == MoveDirectionality.SWAP:
            entries[a] = at_b
        changed |= at_a is not None or at_b is not None
    for i in batch_update.removed:
        changed |= entries.pop(i, None) is not None
    for i, params, prompt_ids, output_ids in batch_update.added:
        state = new_state(params, prompt_ids, output_ids)
        if state is not None:
            entries[i], changed = state, True
        else:
            changed |= entries.pop(i, None) is not None
    return changed
'''),
        ("a swap treated as a one-way move (b's entry lost)", '''
def my_dict_updates(entries, batch_update, new_state):
    if not batch_update:
        return False
    changed = False
    for i in batch_update.removed:
        changed |= entries.pop(i, None) is not None
    for i, params, prompt_ids, output_ids in batch_update.added:
        state = new_state(params, prompt_ids, output_ids)
        if state is not None:
            entries[i], changed = state, True
        else:
            changed |= entries.pop(i, None) is not None
    for a, b, how in batch_update.moved:
        at_a, at_b = entries.pop(a, None), entries.pop(b, None)
        if at_a is not None:
            entries[b] = at_a
        changed |= at_a is not None or at_b is not None
    return changed
'''),
        ('an added request without state leaves the old entry at its index', '''
def my_dict_updates(entries, batch_update, new_state):
    if not batch_update:
        return False
    changed = False
    for i in batch_update.removed:
        changed |= entries.pop(i, None) is not None
    for i, params, prompt_ids, output_ids in batch_update.added:
        state = new_state(params, prompt_ids, output_ids)
        if state is not None:
            entries[i], changed = state, True
    for a, b, how in batch_update.moved:
        at_a, at_b = entries.pop(a, None), entries.pop(b, None)
        if at_a is not None:
            entries[b] = at_a
        if at_b is not None and how == MoveDirectionality.SWAP:
            entries[a] = at_b
        changed |= at_a is not None or at_b is not None
    return changed
'''),
        ('a one-way move copies (the entry stays at a too)', '''
def my_dict_updates(entries, batch_update, new_state):
    if not batch_update:
        return False
    changed = False
    for i in batch_update.removed:
        changed |= entries.pop(i, None) is not None
    for i, params, prompt_ids, output_ids in batch_update.added:
        state = new_state(params, prompt_ids, output_ids)
        if state is not None:
            entries[i], changed = state, True
        else:
            changed |= entries.pop(i, None) is not None
    for a, b, how in batch_update.moved:
        at_a, at_b = entries.get(a), entries.pop(b, None)
        if at_a is not None:
            entries[b] = at_a
        if at_b is not None and how == MoveDirectionality.SWAP:
            entries[a] = at_b
        changed |= at_a is not None or at_b is not None
    return changed
'''),
        ('always reports a change', '''
def my_dict_updates(entries, batch_update, new_state):
    if not batch_update:
        return False
    changed = False
    for i in batch_update.removed:
        changed |= entries.pop(i, None) is not None
    for i, params, prompt_ids, output_ids in batch_update.added:
        state = new_state(params, prompt_ids, output_ids)
        if state is not None:
            entries[i], changed = state, True
        else:
            changed |= entries.pop(i, None) is not None
    for a, b, how in batch_update.moved:
        at_a, at_b = entries.pop(a, None), entries.pop(b, None)
        if at_a is not None:
            entries[b] = at_a
        if at_b is not None and how == MoveDirectionality.SWAP:
            entries[a] = at_b
        changed |= at_a is not None or at_b is not None
    return True
'''),
    ],
    ("07c_scaling_out", "my_micro_batches"): [
        ('cut by request count, not by tokens', '''
def my_micro_batches(query_start_loc, m):
    n, total = len(query_start_loc) - 1, query_start_loc[-1]
    if n <= 1 or m <= 1:
        return [(0, n)]
    cuts = {max(1, min(n - 1, round(n * k / m))) for k in range(1, m)}
    cuts = sorted(cuts)
    return list(zip([0] + cuts, cuts + [n]))
'''),
        ('boundaries 0 and n allowed (empty groups)', '''
def my_micro_batches(query_start_loc, m):
    n, total = len(query_start_loc) - 1, query_start_loc[-1]
    if n <= 1 or m <= 1:
        return [(0, n)]
    cuts = set()
    for k in range(1, m):
        goal = total * k / m
        cuts.add(min(range(0, n + 1), key=lambda i: abs(query_start_loc[i] - goal)))
    cuts = sorted(cuts)
    return list(zip([0] + cuts, cuts + [n]))
'''),
        ('repeated cuts kept (an empty group)', '''
def my_micro_batches(query_start_loc, m):
    n, total = len(query_start_loc) - 1, query_start_loc[-1]
    if n <= 1 or m <= 1:
        return [(0, n)]
    cuts = []
    for k in range(1, m):
        goal = total * k / m
        cuts.append(min(range(1, n), key=lambda i: abs(query_start_loc[i] - goal)))
    cuts = sorted(cuts)
    return list(zip([0] + cuts, cuts + [n]))
'''),
        ('the last boundary at or below the goal, not the nearest', '''
def my_micro_batches(query_start_loc, m):
    n, total = len(query_start_loc) - 1, query_start_loc[-1]
    if n <= 1 or m <= 1:
        return [(0, n)]
    cuts = set()
    for k in range(1, m):
        goal = total * k / m
        cuts.add(max([i for i in range(1, n) if query_start_loc[i] <= goal], default=1))
    cuts = sorted(cuts)
    return list(zip([0] + cuts, cuts + [n]))
'''),
        ('on a tie, the later boundary', '''
def my_micro_batches(query_start_loc, m):
    n, total = len(query_start_loc) - 1, query_start_loc[-1]
    if n <= 1 or m <= 1:
        return [(0, n)]
    cuts = set()
    for k in range(1, m):
        goal = total * k / m
        cuts.add(min(range(n - 1, 0, -1), key=lambda i: abs(query_start_loc[i] - goal)))
    cuts = sorted(cuts)
    return list(zip([0] + cuts, cuts + [n]))
'''),
    ],
    ("08_processor", "my_children"): [
        ("the seed the same for every child", '''
def my_children(request_id, params, in_use):
    out = []
    for i in range(params.n):
        rid, k = f"{i}_{request_id}", 0
        while rid in in_use:
            k += 1
            rid = f"{i}_{request_id}#{k}"
        p = params.clone()
        p.n = 1
        out.append((rid, p))
    return out
'''),
        ("ids in use not avoided", '''
def my_children(request_id, params, in_use):
    out = []
    for i in range(params.n):
        p = params.clone()
        p.n = 1
        if p.seed is not None:
            p.seed += i
        out.append((f"{i}_{request_id}", p))
    return out
'''),
        ("the parent's params changed in place (one object for every child)", '''
def my_children(request_id, params, in_use):
    out, seed = [], params.seed
    for i in range(params.n):
        rid, k = f"{i}_{request_id}", 0
        while rid in in_use:
            k += 1
            rid = f"{i}_{request_id}#{k}"
        params.n = 1
        if seed is not None:
            params.seed = seed + i
        out.append((rid, params))
    return out
'''),
        ("the index after the id (f'{request_id}_{i}')", '''
def my_children(request_id, params, in_use):
    out = []
    for i in range(params.n):
        rid, k = f"{request_id}_{i}", 0
        while rid in in_use:
            k += 1
            rid = f"{request_id}_{i}#{k}"
        p = params.clone()
        p.n = 1
        if p.seed is not None:
            p.seed += i
        out.append((rid, p))
    return out
'''),
        ("only one retry suffix tried (#1)", '''
def my_children(request_id, params, in_use):
    out = []
    for i in range(params.n):
        rid = f"{i}_{request_id}"
        if rid in in_use:
            rid += "#1"
        p = params.clone()
        p.n = 1
        if p.seed is not None:
            p.seed += i
        out.append((rid, p))
    return out
'''),
    ],
    ("14b_data_parallel", "my_front_end_usage"): [
        ("the mean of the engines' own usages (engines of different sizes weigh the same)", '''
def my_front_end_usage(engines):
    live = [g for g, dead in engines if not dead]
    return sum(g["kv_cache_usage"] for g in live) / len(live)
'''),
        ("dead engines' last reports counted", '''
def my_front_end_usage(engines):
    total = sum(g["num_blocks"] for g, _ in engines)
    free = sum(g["free_blocks"] for g, _ in engines)
    return 1 - free / total
'''),
        ('the free share, not the used share', '''
def my_front_end_usage(engines):
    live = [g for g, dead in engines if not dead]
    return sum(g["free_blocks"] for g in live) / sum(g["num_blocks"] for g in live)
'''),
        ("the busiest live engine's usage", '''
def my_front_end_usage(engines):
    return max(1 - g["free_blocks"] / g["num_blocks"] for g, dead in engines if not dead)
'''),
    ],
    ("17_cli", "my_nested"): [
        ("values kept as strings (no JSON)", '''
def my_nested(pairs):
    out = {}
    for name, text in pairs:
        flag, *keys = name.split(".")
        d = out.setdefault(flag, {})
        for k in keys[:-1]:
            d = d.setdefault(k, {})
        d[keys[-1]] = text
    return out
'''),
        ("each pair starts its flag's dict afresh (earlier keys lost)", '''
def my_nested(pairs):
    out = {}
    for name, text in pairs:
        flag, *keys = name.split(".")
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            value = text
        d = out[flag] = {}
        for k in keys[:-1]:
            d = d.setdefault(k, {})
        d[keys[-1]] = value
    return out
'''),
        ("one level only: the rest of the name as one key", '''
def my_nested(pairs):
    out = {}
    for name, text in pairs:
        flag, key = name.split(".", 1)
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            value = text
        out.setdefault(flag, {})[key] = value
    return out
'''),
        ("the first value for a key kept", '''
def my_nested(pairs):
    out = {}
    for name, text in pairs:
        flag, *keys = name.split(".")
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            value = text
        d = out.setdefault(flag, {})
        for k in keys[:-1]:
            d = d.setdefault(k, {})
        d.setdefault(keys[-1], value)
    return out
'''),
    ],
    ("11_metrics", "my_cumulative_buckets"): [
        ("each bucket's own count, not cumulative", '''
def my_cumulative_buckets(values, bounds):
    out, lo = {}, float("-inf")
    for b in bounds:
        out[str(float(b))] = sum(lo < v <= b for v in values)
        lo = b
    return {**out, "+Inf": len(values)}
'''),
        ("a value on a bound counted in the next bucket (< instead of <=)", '''
def my_cumulative_buckets(values, bounds):
    out = {str(float(b)): sum(v < b for v in values) for b in bounds}
    return {**out, "+Inf": len(values)}
'''),
        ("no +Inf bucket", '''
def my_cumulative_buckets(values, bounds):
    return {str(float(b)): sum(v <= b for v in values) for b in bounds}
'''),
        ("+Inf counting only the values above the last bound", '''
def my_cumulative_buckets(values, bounds):
    out = {str(float(b)): sum(v <= b for v in values) for b in bounds}
    return {**out, "+Inf": sum(v > bounds[-1] for v in values)}
'''),
        ("the bounds as given (1, not 1.0) for keys", '''
def my_cumulative_buckets(values, bounds):
    out = {str(b): sum(v <= b for v in values) for b in bounds}
    return {**out, "+Inf": len(values)}
'''),
    ],
    ("16b_course", "my_blank"): [
        ("the docstring blanked with the body", """
def my_blank(src, hint):
    lines = src.splitlines()
    funcs = [n for n in ast.parse(src).body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    for f in reversed(funcs):
        indent = " " * f.body[0].col_offset
        lines[f.body[0].lineno - 1 : f.end_lineno] = [f"{indent}raise NotImplementedError({repr('hint: ' + hint)})"]
    return "\\n".join(lines) + "\\n"
"""),
        ("the first function first: the line numbers of the next ones have moved", """
def my_blank(src, hint):
    lines = src.splitlines()
    funcs = [n for n in ast.parse(src).body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    for f in funcs:
        body = f.body[1:] if ast.get_docstring(f) is not None else f.body
        indent = " " * body[0].col_offset
        lines[body[0].lineno - 1 : f.end_lineno] = [f"{indent}raise NotImplementedError({repr('hint: ' + hint)})"]
    return "\\n".join(lines) + "\\n"
"""),
        ("indented by four spaces, whatever the body's indent", """
def my_blank(src, hint):
    lines = src.splitlines()
    funcs = [n for n in ast.parse(src).body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    for f in reversed(funcs):
        body = f.body[1:] if ast.get_docstring(f) is not None else f.body
        lines[body[0].lineno - 1 : f.end_lineno] = [f"    raise NotImplementedError({repr('hint: ' + hint)})"]
    return "\\n".join(lines) + "\\n"
"""),
        ("every function of the tree (ast.walk): a class's methods blanked too", """
def my_blank(src, hint):
    lines = src.splitlines()
    funcs = [n for n in ast.walk(ast.parse(src)) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    for f in sorted(funcs, key=lambda f: f.lineno, reverse=True):
        body = f.body[1:] if ast.get_docstring(f) is not None else f.body
        indent = " " * body[0].col_offset
        lines[body[0].lineno - 1 : f.end_lineno] = [f"{indent}raise NotImplementedError({repr('hint: ' + hint)})"]
    return "\\n".join(lines) + "\\n"
"""),
        ("up to the last statement's first line, not the function's last line", """
def my_blank(src, hint):
    lines = src.splitlines()
    funcs = [n for n in ast.parse(src).body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    for f in reversed(funcs):
        body = f.body[1:] if ast.get_docstring(f) is not None else f.body
        indent = " " * body[0].col_offset
        lines[body[0].lineno - 1 : body[-1].lineno] = [f"{indent}raise NotImplementedError({repr('hint: ' + hint)})"]
    return "\\n".join(lines) + "\\n"
"""),
        ("the hint alone, without 'hint: '", """
def my_blank(src, hint):
    lines = src.splitlines()
    funcs = [n for n in ast.parse(src).body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    for f in reversed(funcs):
        body = f.body[1:] if ast.get_docstring(f) is not None else f.body
        indent = " " * body[0].col_offset
        lines[body[0].lineno - 1 : f.end_lineno] = [f"{indent}raise NotImplementedError({hint!r})"]
    return "\\n".join(lines) + "\\n"
"""),
    ],
    ("90_viz", "my_block_view"): [
        ("not clipped to a block: a full block counts every slot after it", """
def my_block_view(tables, num_slots, block_size, num_blocks):
    view = [([], 0) for _ in range(num_blocks)]
    for rid, table in tables.items():
        for j, b in enumerate(table):
            owners, filled = view[b]
            view[b] = (owners + [rid], max(filled, max(0, num_slots[rid] - j * block_size)))
    return view
"""),
        ("not clipped at 0: a block past the tokens counts less than none", """
def my_block_view(tables, num_slots, block_size, num_blocks):
    owners, filled = {}, {}
    for rid, table in tables.items():
        for j, b in enumerate(table):
            owners.setdefault(b, []).append(rid)
            held = min(block_size, num_slots[rid] - j * block_size)
            filled[b] = max(filled.get(b, held), held)
    return [(owners.get(b, []), filled.get(b, 0)) for b in range(num_blocks)]
"""),
        ("a shared block: the first owner's count, not the most", """
def my_block_view(tables, num_slots, block_size, num_blocks):
    view = [([], 0) for _ in range(num_blocks)]
    for rid, table in tables.items():
        for j, b in enumerate(table):
            owners, filled = view[b]
            held = max(0, min(block_size, num_slots[rid] - j * block_size))
            view[b] = (owners + [rid], filled if owners else held)
    return view
"""),
        ("the owners sorted, not in the order of the tables", """
def my_block_view(tables, num_slots, block_size, num_blocks):
    view = [([], 0) for _ in range(num_blocks)]
    for rid, table in tables.items():
        for j, b in enumerate(table):
            owners, filled = view[b]
            held = max(0, min(block_size, num_slots[rid] - j * block_size))
            view[b] = (sorted(owners + [rid]), max(filled, held))
    return view
"""),
        ("every block but the last counted full, the last n % block_size", """
def my_block_view(tables, num_slots, block_size, num_blocks):
    view = [([], 0) for _ in range(num_blocks)]
    for rid, table in tables.items():
        for j, b in enumerate(table):
            owners, filled = view[b]
            n = num_slots[rid]
            held = block_size if j < len(table) - 1 else n % block_size or block_size
            view[b] = (owners + [rid], max(filled, held))
    return view
"""),
    ],
}
