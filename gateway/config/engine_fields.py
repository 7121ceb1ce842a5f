"""The names `engine_args` may use: the options of `vllm run_batch` (vLLM 0.32.0), by python name.

That is vLLM's `AsyncEngineArgs` fields plus run_batch's frontend options (`chat_template`,
`response_role`, tool and reasoning parsers, ...): `local_engine.serving.build_args` lays
`engine_args` over exactly that namespace. Written out so that loading a config does not import
vLLM (about 15 s and a GiB in the API process, which never starts an engine); a test compares the
list with the installed vLLM's parser and `dataclasses.fields(AsyncEngineArgs)`. run_batch's own
`input_file`/`output_file` are batchyard's to set, so they are left out.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from typing import Any

VLLM_ENGINE_ARGS = frozenset({
    "additional_config", "aggregate_engine_logging", "all2all_backend", "allow_deprecated_quantization",
    "allowed_local_media_path", "allowed_media_domains", "anthropic_disabled_thinking_effort", "async_scheduling",
    "attention_backend", "attention_config", "aux_output_config", "block_size", "chat_template",
    "chat_template_content_format", "code_revision", "cohere_format", "cohere_is_reasoning_model",
    "collect_detailed_traces", "compilation_config", "config_format", "convert", "cp_kv_cache_interleave_size",
    "cpu_distributed_timeout_seconds", "cpu_offload_gb", "cpu_offload_params", "cudagraph_capture_sizes",
    "cudagraph_metrics", "custom_histogram_buckets", "data_parallel_address", "data_parallel_backend",
    "data_parallel_external_lb", "data_parallel_hybrid_lb", "data_parallel_multi_port_external_lb",
    "data_parallel_rank", "data_parallel_rpc_port", "data_parallel_size", "data_parallel_size_local",
    "data_parallel_start_rank", "dbo_decode_token_threshold", "dbo_prefill_token_threshold", "dcp_comm_backend",
    "dcp_kv_cache_interleave_size", "dcp_q_replicate", "decode_context_parallel_size",
    "default_chat_template_kwargs", "default_mm_loras", "device_ids", "diffusion_config", "disable_cascade_attn",
    "disable_chunked_mm_input", "disable_custom_all_reduce", "disable_hybrid_kv_cache_manager",
    "disable_log_stats", "disable_nccl_for_dp_synchronization", "disable_sliding_window",
    "distributed_executor_backend", "distributed_timeout_seconds", "download_dir", "dp_sync_interval", "dtype",
    "ec_manager_config", "ec_transfer_config", "elastic_ep_max_dp_size", "enable_auto_tool_choice",
    "enable_batch_sharded_sampling", "enable_chunked_prefill", "enable_cumem_allocator", "enable_dbo",
    "enable_elastic_ep", "enable_ep_weight_filter", "enable_eplb", "enable_expert_parallel",
    "enable_fault_tolerance", "enable_flashinfer_autotune", "enable_force_include_usage", "enable_hc_sp",
    "enable_layerwise_nvtx_tracing", "enable_log_deltas", "enable_log_outputs", "enable_log_requests",
    "enable_logging_iteration_details", "enable_lora", "enable_mamba_cache_stochastic_rounding",
    "enable_mamba_shared_prefix_checkpoint", "enable_metrics", "enable_mfu_metrics",
    "enable_mixed_moe_lora_format", "enable_mm_embeds", "enable_moe_shared_loras", "enable_nccl_comm_suspend",
    "enable_per_request_metrics", "enable_prefix_caching", "enable_prompt_embeds", "enable_prompt_tokens_details",
    "enable_return_routed_experts", "enable_scale_out", "enable_server_load_tracking", "enable_shm_tensor_arena",
    "enable_sleep_mode", "enable_tokenizer_info_endpoint", "enable_tower_connector_lora", "enable_trace_replay",
    "enforce_eager", "engram_config", "eplb_config", "exclude_tools_when_tool_choice_none",
    "expert_placement_strategy", "fail_on_environ_validation", "fault_tolerance_config", "fingerprint_mode",
    "fingerprint_value", "fully_sharded_loras", "gdn_prefill_backend", "generation_config",
    "gpu_memory_utilization", "hf_config_path", "hf_overrides", "hf_token", "host", "ignore_patterns",
    "interleave_mm_strings", "io_processor_plugin", "ir_op_priority", "jit_monitor_mode", "jit_monitor_verbose",
    "kda_decode_backend", "kda_prefill_backend", "kernel_config", "kv_cache_dtype", "kv_cache_dtype_skip_layers",
    "kv_cache_memory_bytes", "kv_cache_metrics", "kv_cache_metrics_sample", "kv_events_config",
    "kv_offloading_backend", "kv_offloading_size", "kv_sharing_fast_prefill", "kv_transfer_config",
    "language_model_only", "limit_mm_per_prompt", "linear_backend", "load_format", "log_config_file",
    "log_error_stack", "log_level", "logging_config", "logits_processors", "logprobs_mode",
    "long_prefill_token_threshold", "long_prefill_token_threshold_adaptive", "lora_dtype", "lora_modules",
    "lora_target_modules", "mamba_backend", "mamba_block_size", "mamba_cache_dtype", "mamba_cache_mode",
    "mamba_cache_philox_rounds", "mamba_ssm_cache_dtype", "mamba_ssu_algorithm", "master_addr", "master_port",
    "max_cpu_loras", "max_cudagraph_capture_size", "max_log_len", "max_logprobs", "max_lora_cls_labels",
    "max_lora_rank", "max_loras", "max_model_len", "max_num_active_seqs", "max_num_batched_tokens",
    "max_num_queued_reqs", "max_num_queued_tokens", "max_num_scheduled_tokens", "max_num_seqs",
    "max_parallel_loading_workers", "media_io_kwargs", "mm_device_do_normalize", "mm_encoder_attn_backend",
    "mm_encoder_attn_dtype", "mm_encoder_fp8_scale_path", "mm_encoder_fp8_scale_save_margin",
    "mm_encoder_fp8_scale_save_path", "mm_encoder_only", "mm_encoder_tp_mode", "mm_hasher_algorithm",
    "mm_ipc_gpu_memory_gb", "mm_processor_cache_gb", "mm_processor_cache_type", "mm_processor_device",
    "mm_processor_kwargs", "mm_shm_cache_max_object_size_mb", "mm_tensor_ipc", "model", "model_class_overrides",
    "model_impl", "model_loader_extra_config", "moe_backend", "nnodes", "node_rank", "num_gpu_blocks_override",
    "numa_bind", "numa_bind_cpus", "numa_bind_nodes", "offload_backend", "offload_group_size",
    "offload_num_in_group", "offload_params", "offload_prefetch_step", "optimization_level",
    "otlp_traces_endpoint", "output_tmp_dir", "override_generation_config", "per_request_spec_decode_metrics",
    "performance_mode", "pipeline_parallel_size", "pooler_config", "port", "prefill_context_parallel_size",
    "prefill_schedule_interval", "prefix_cache_retention_interval", "prefix_caching_hash_algo",
    "prefix_match_unit", "profiler_config", "pt_load_map_location", "quantization", "quantization_config",
    "ray_workers_use_nsight", "reasoning_config", "reasoning_parser", "reasoning_parser_plugin",
    "renderer_num_workers", "replayssm_buffer_len", "response_role", "return_sampling_mask",
    "return_tokens_as_token_ids", "revision", "runner", "safetensors_load_strategy",
    "safetensors_prefetch_block_size", "safetensors_prefetch_num_threads", "scheduler_cls",
    "scheduler_reserve_full_isl", "scheduling_policy", "seed", "served_model_name",
    "show_hidden_metrics_for_version", "shutdown_timeout", "skip_mm_profiling", "skip_tokenizer_init",
    "sleep_mode_offload_cudagraph", "sleep_preserve_parameter_names", "sparse_indexer_topk_backend",
    "spec_method", "spec_model", "spec_tokens", "specialize_active_lora", "speculative_config",
    "sse_keep_alive_interval", "stream_interval", "structured_outputs_config", "swa_bounded_replay",
    "tensor_parallel_size", "tokenizer", "tokenizer_mode", "tokenizer_revision", "tokens_only",
    "tool_call_parser", "tool_parser_plugin", "tool_server", "tool_strict_level", "trust_remote_code",
    "trust_request_chat_template", "trust_request_mm_kwargs", "ubatch_size", "url", "use_fp64_gumbel",
    "use_replayssm", "use_tqdm_on_load", "video_pruning_method", "video_pruning_rate", "watermark",
    "watermark_config", "weight_transfer_config", "worker_cls", "worker_extension_cls"
})


# The parser names vLLM registers (vllm/reasoning/__init__.py, vllm/tool_parsers/__init__.py): an unknown
# one would otherwise fail only once the engine has loaded, a minute or more on a CPU. A `*_plugin` option
# may register more names, so with one set the name is left to vLLM.
VLLM_PARSERS: dict[str, tuple[frozenset[str], str]] = {
    "reasoning_parser": (frozenset({
        'cohere_command3', 'cohere_command4', 'deepseek_r1', 'deepseek_v3', 'deepseek_v4', 'deepseek_v41', 'ernie45',
        'gemma4', 'glm45', 'glm47', 'granite', 'granite_thinking_parser', 'hf', 'holo2', 'hunyuan_a13b', 'hy_v3',
        'hy_v4', 'inkling', 'k2_horizon', 'kimi_k2', 'kimi_k3', 'ling3', 'mimo', 'minicpmv', 'minimax_m2',
        'minimax_m2_append_think', 'minimax_m3', 'mistral', 'muse_glimmer', 'nemotron_v3', 'olmo3', 'openai_gptoss',
        'plamo3', 'poolside_v1', 'qwen3', 'seed_oss', 'step3', 'step3p5',
    }), "reasoning_parser_plugin"),
    "tool_call_parser": (frozenset({
        'apertus', 'cohere_command3', 'cohere_command4', 'deepseek_v3', 'deepseek_v31', 'deepseek_v32', 'deepseek_v4',
        'deepseek_v41', 'dots', 'ernie45', 'functiongemma', 'gemma4', 'gigachat3', 'glm45', 'glm47', 'granite',
        'granite-20b-fc', 'granite4', 'hermes', 'hf', 'hunyuan_a13b', 'hy_v3', 'hy_v4', 'inkling', 'internlm', 'jamba',
        'k2_horizon', 'kimi_k2', 'kimi_k3', 'lfm2', 'ling3', 'llama3_json', 'llama4_json', 'llama4_pythonic', 'longcat',
        'mimo', 'minicpm5', 'minimax_m2', 'minimax_m3', 'mistral', 'muse_glimmer', 'olmo3', 'openai', 'phi4_mini_json',
        'plamo3', 'poolside_v1', 'pythonic', 'qwen3_coder', 'qwen3_json', 'qwen3_xml', 'seed_oss', 'step3', 'step3p5',
        'xlam',
    }), "tool_parser_plugin"),
}


def unknown_parser(args: Mapping[str, Any]) -> tuple[str, str] | None:
    """(option, problem) for a parser name vLLM does not register; None when every one is known."""
    for option, (known, plugin) in VLLM_PARSERS.items():
        name = args.get(option)
        if isinstance(name, str) and name not in known and not args.get(plugin):
            close = difflib.get_close_matches(name, sorted(known), n=1)
            hint = f"did you mean {close[0]}? " if close else ""
            return option, f"{name!r} is not a {option} of vLLM; {hint}known: {', '.join(sorted(known))}"
    return None


def unknown_engine_args(names: Iterable[str]) -> list[str]:
    """The names vLLM's run_batch does not take (dashes count as underscores, as on its command line)."""
    return [n for n in names if str(n).replace("-", "_") not in VLLM_ENGINE_ARGS]


__all__ = ["VLLM_ENGINE_ARGS", "VLLM_PARSERS", "unknown_engine_args", "unknown_parser"]
