"""A vLLM user's habits, unchanged: every `EngineArgs` field of vLLM accepted or refused by name (from `LLM(...)`,
`EngineArgs(...)` and the command line), models by hub id from the HF cache, vLLM's default sampling from the
model's `generation_config.json`, no silent drops, and the import surface."""
import json, os, shutil, subprocess, sys
import pytest
from minivllm import EngineArgs, LLM, SamplingParams
from minivllm.serve.cli import FlexibleArgumentParser
from minivllm.compat.vllm import _VLLM_ARGS

pytestmark = pytest.mark.xdist_group("vllm_parity")

# vLLM's `EngineArgs` fields (vllm/engine/arg_utils.py, class EngineArgs, vLLM main branch, commit 99d7eb5d), as data.
VLLM_ENGINE_ARGS = """model served_model_name tokenizer hf_config_path runner convert task skip_tokenizer_init
enable_prompt_embeds tokenizer_mode trust_remote_code allowed_local_media_path allowed_media_domains download_dir
safetensors_load_strategy load_format config_format dtype kv_cache_dtype seed max_model_len cuda_graph_sizes
cudagraph_capture_sizes max_cudagraph_capture_size distributed_executor_backend pipeline_parallel_size
tensor_parallel_size decode_context_parallel_size data_parallel_size data_parallel_rank data_parallel_start_rank
data_parallel_size_local data_parallel_address data_parallel_rpc_port data_parallel_hybrid_lb data_parallel_backend
enable_expert_parallel all2all_backend enable_dbo dbo_decode_token_threshold dbo_prefill_token_threshold
disable_nccl_for_dp_synchronization eplb_config enable_eplb expert_placement_strategy _api_process_count
_api_process_rank num_redundant_experts eplb_window_size eplb_step_interval eplb_log_balancedness
max_parallel_loading_workers block_size enable_prefix_caching prefix_caching_hash_algo disable_sliding_window
disable_cascade_attn swap_space cpu_offload_gb gpu_memory_utilization kv_cache_memory_bytes max_num_batched_tokens
max_num_partial_prefills max_long_partial_prefills long_prefill_token_threshold max_num_seqs max_logprobs
logprobs_mode disable_log_stats aggregate_engine_logging revision code_revision rope_scaling rope_theta hf_token
hf_overrides tokenizer_revision quantization enforce_eager disable_custom_all_reduce limit_mm_per_prompt
enable_mm_embeds interleave_mm_strings media_io_kwargs mm_processor_kwargs disable_mm_preprocessor_cache
mm_processor_cache_gb mm_processor_cache_type mm_shm_cache_max_object_size_mb mm_encoder_tp_mode
mm_encoder_attn_backend io_processor_plugin skip_mm_profiling video_pruning_rate enable_lora max_loras max_lora_rank
default_mm_loras fully_sharded_loras max_cpu_loras lora_dtype lora_extra_vocab_size ray_workers_use_nsight
num_gpu_blocks_override num_lookahead_slots model_loader_extra_config ignore_patterns enable_chunked_prefill
disable_chunked_mm_input disable_hybrid_kv_cache_manager structured_outputs_config reasoning_parser
guided_decoding_backend guided_decoding_disable_fallback guided_decoding_disable_any_whitespace
guided_decoding_disable_additional_properties logits_processor_pattern speculative_config
show_hidden_metrics_for_version otlp_traces_endpoint collect_detailed_traces scheduling_policy scheduler_cls
external_parameters pooler_config override_pooler_config compilation_config worker_cls worker_extension_cls
kv_transfer_config kv_events_config generation_config enable_sleep_mode override_generation_config model_impl
override_attention_dtype calculate_kv_scales mamba_cache_dtype mamba_ssm_cache_dtype mamba_block_size
additional_config use_tqdm_on_load pt_load_map_location enable_multimodal_encoder_data_parallel logits_processors
async_scheduling kv_sharing_fast_prefill""".split()

# vLLM's defaults of the fields minivllm has no field of its own for (what a script passing `**vars(args)` sends)
VLLM_DEFAULTS = dict(served_model_name=None, hf_config_path=None, runner="auto", convert="auto", task=None,
    skip_tokenizer_init=False, enable_prompt_embeds=False, tokenizer_mode="auto", trust_remote_code=False,
    allowed_local_media_path="", allowed_media_domains=None, load_format="auto", config_format="auto",
    kv_cache_dtype="auto", distributed_executor_backend=None, pipeline_parallel_size=1, data_parallel_size=1,
    swap_space=4, cpu_offload_gb=0, enable_lora=False, max_loras=1, quantization=None, rope_scaling={}, hf_overrides={},
    disable_custom_all_reduce=False, compilation_config=None, logits_processors=None, speculative_config=None,
    enable_sleep_mode=False, model_impl="auto", async_scheduling=False, structured_outputs_config=None)

# a value of each field that minivllm cannot honour (it must raise NotImplementedError naming the field)
VLLM_UNSUPPORTED = dict(quantization="awq", decode_context_parallel_size=2, data_parallel_rank=1, fully_sharded_loras=True,
    kv_cache_dtype="fp8", speculative_config={"method": "eagle", "num_speculative_tokens": 2}, cpu_offload_gb=4, tokenizer_mode="mistral",
    skip_tokenizer_init=True, enable_sleep_mode=True, async_scheduling=True,
    rope_scaling={"rope_type": "dynamic", "factor": 2.0}, model_impl="transformers",
    enable_expert_parallel=True, compilation_config={"level": 3, "splitting_ops": []}, load_format="tensorizer",
    disable_sliding_window=True)


def test_every_vllm_engine_arg_is_known():
    "Every field of vLLM's list is a field of minivllm's EngineArgs or in its table of vLLM-only arguments."
    own = set(EngineArgs.__dataclass_fields__)
    missing = [f for f in VLLM_ENGINE_ARGS if f not in own and f not in _VLLM_ARGS]
    assert missing == []


@pytest.mark.parametrize("name", [f for f in VLLM_ENGINE_ARGS if f in VLLM_UNSUPPORTED])
def test_unsupported_values_raise_by_name(name):
    with pytest.raises(NotImplementedError, match=name):
        EngineArgs(**{name: VLLM_UNSUPPORTED[name]})
    p = EngineArgs.add_cli_args(FlexibleArgumentParser())
    v = VLLM_UNSUPPORTED[name]
    argv = ([f"--{name.replace('_', '-')}"] if v is True else [f"--{name.replace('_', '-')}", json.dumps(v) if not isinstance(v, str) else v])
    with pytest.raises(NotImplementedError, match=name):
        EngineArgs.from_cli_args(p.parse_args(argv))


def test_vllm_defaults_accepted():
    ea = EngineArgs(**VLLM_DEFAULTS)
    assert ea == EngineArgs() and ea.vllm_args["swap_space"] == 4
    for name in VLLM_ENGINE_ARGS:   # each field alone, at vLLM's default where we list it: never a TypeError
        if name in VLLM_DEFAULTS: EngineArgs(**{name: VLLM_DEFAULTS[name]})
    with pytest.raises(TypeError, match="unexpected keyword argument 'max_num_seq'"): EngineArgs(max_num_seq=4)


def test_cli_flags_for_vllm_args():
    p = EngineArgs.add_cli_args(FlexibleArgumentParser())
    ea = EngineArgs.from_cli_args(p.parse_args(["--trust-remote-code", "--swap-space", "16", "--enforce-eager",
                                                "--generation-config", "vllm", "--max-logprobs", "5", "--revision", "main"]))
    assert ea.vllm_args == dict(trust_remote_code=True, swap_space=16.0)
    assert (ea.enforce_eager, ea.generation_config, ea.max_logprobs, ea.revision) == (True, "vllm", 5, "main")
    r = subprocess.run([sys.executable, "-m", "minivllm", "generate", "--decode-context-parallel-size", "2"], capture_output=True, text=True)
    assert r.returncode == 2 and "decode_context_parallel_size=2" in r.stderr


@pytest.fixture(scope="module")
def hub_cache(tmp_path_factory, model_dir):
    "A temporary HF cache in the hub's layout holding `minivllm-test/tiny-llama` at two revisions (main and v1)."
    from minivllm.core.model import make_tiny_checkpoint
    cache = tmp_path_factory.mktemp("hf_cache")
    repo = cache / "models--minivllm-test--tiny-llama"
    src = tmp_path_factory.mktemp("tiny")
    make_tiny_checkpoint(src, "llama", tokenizer_from=model_dir, vocab_size=49152, tie_word_embeddings=True)
    for ref, commit, gen in [("main", "a" * 40, dict(temperature=0.6, top_p=0.9, top_k=20, max_new_tokens=7)),
                             ("v1", "b" * 40, dict(temperature=0.3))]:
        snap = repo / "snapshots" / commit
        shutil.copytree(src, snap)
        (snap / "generation_config.json").write_text(json.dumps(dict(bos_token_id=1, eos_token_id=2, **gen)))
        (repo / "refs").mkdir(parents=True, exist_ok=True)
        (repo / "refs" / ref).write_text(commit)
    return cache


def test_hub_id_offline(hub_cache, monkeypatch):
    "A hub id resolves offline from the HF cache (download_dir, or $HF_HUB_CACHE), at a revision; sampling defaults follow it."
    import huggingface_hub.constants
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    llm = LLM(model="minivllm-test/tiny-llama", download_dir=str(hub_cache), max_model_len=128, num_gpu_blocks_override=32,
              trust_remote_code=False, revision=None, tokenizer_mode="auto", swap_space=4, enable_lora=False,
              pipeline_parallel_size=1, max_logprobs=20, disable_custom_all_reduce=False, compilation_config=None,
              hf_token=None, logits_processors=None)
    assert llm.llm_engine.get_model_config().model.endswith("a" * 40)
    sp = llm.get_default_sampling_params()   # vLLM's generation_config="auto": from generation_config.json
    assert (sp.temperature, sp.top_p, sp.top_k, sp.max_tokens) == (0.6, 0.9, 20, 7)
    out = llm.generate("Hello", use_tqdm=False)[0]
    assert len(out.outputs[0].token_ids) <= 7
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(hub_cache))
    v1 = LLM(model="minivllm-test/tiny-llama", revision="v1", max_model_len=128, num_gpu_blocks_override=32)
    assert v1.llm_engine.get_model_config().model.endswith("b" * 40)
    assert v1.get_default_sampling_params().temperature == 0.3
    assert LLM(model="minivllm-test/tiny-llama", generation_config="vllm", max_model_len=128,
               num_gpu_blocks_override=32).get_default_sampling_params() == SamplingParams()
    with pytest.raises(ValueError, match="model hub"):
        LLM(model="minivllm-test/no-such-model", max_model_len=128)


def test_no_silent_drops(hub_cache, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    llm = LLM(model="minivllm-test/tiny-llama", download_dir=str(hub_cache), max_model_len=128, num_gpu_blocks_override=32)
    with pytest.raises(NotImplementedError, match="multi_modal_data"):
        llm.generate({"prompt": "hi", "multi_modal_data": {"image": object()}}, use_tqdm=False)
    with pytest.raises(ValueError, match="promt"): llm.generate({"promt": "hi"}, use_tqdm=False)
    from minivllm import LLMEngine
    with pytest.raises(NotImplementedError, match="executor_class"): LLMEngine(llm.llm_engine.vllm_config, object, True)
    with pytest.raises(TypeError): llm.wait_for_completion(False)
    with pytest.raises(TypeError): LLM("minivllm-test/tiny-llama", "tokenizer")   # vLLM's LLM: keywords after model
    assert SamplingParams(extra_args={"k": 1}).extra_args == {"k": 1}             # vLLM passes extra_args through
    with pytest.raises(NotImplementedError, match="LLM.sleep"): llm.sleep()
    llm.llm_engine.engine_core.shutdown()


def test_chat_template_argument(hub_cache, monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    tpl = tmp_path / "t.jinja"
    tpl.write_text("{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}")
    llm = LLM(model="minivllm-test/tiny-llama", download_dir=str(hub_cache), max_model_len=128, num_gpu_blocks_override=32,
              chat_template=str(tpl))
    msgs = [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]
    out = llm.chat(msgs, SamplingParams(max_tokens=1), use_tqdm=False)[0]
    assert out.prompt == "[user] a\nb\n"
    out = llm.chat(msgs, SamplingParams(max_tokens=1), use_tqdm=False, chat_template="{{ messages[0]['content'] | length }}",
                   chat_template_content_format="openai")[0]
    assert out.prompt == "2"


def test_import_surface():
    import minivllm
    ns = {}
    exec("from minivllm import *", ns)
    for name in ["LLM", "SamplingParams", "EngineArgs", "LLMEngine", "AsyncLLMEngine", "AsyncLLM", "AsyncEngineArgs",
                 "RequestOutput", "CompletionOutput", "RequestOutputKind", "BeamSearchParams", "TextPrompt", "TokensPrompt"]:
        assert name in ns, name
    for m in ["get_metrics", "enqueue_chat", "from_engine_args", "sleep", "wake_up", "start_profile", "collective_rpc",
              "reset_prefix_cache", "chat", "generate", "beam_search", "get_default_sampling_params"]:
        assert hasattr(minivllm.LLM, m), m
    assert hasattr(minivllm.LLMEngine, "get_decoding_config")
    r = subprocess.run([sys.executable, "-m", "minivllm", "serve", "--help"], capture_output=True, text=True)
    assert r.returncode == 0 and "--chat-template" in r.stdout and "--trust-remote-code" in r.stdout
