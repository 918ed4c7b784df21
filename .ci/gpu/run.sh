# The GPU run (STAGE=tests|kernels|startup|bench|real): wheels, then the GPU tests, the kernel benchmarks, start-up and
# end-to-end benchmarks on random SmolLM2-shaped weights (the real weights cannot travel to the GPU machine); `real`:
# the Llama-3.2-1B and Llama-3.1-8B shapes (real_size.py, built on the GPU), the 1B batch-1 profile, the collector pair.
# Not part of CI. Prepared on the CPU machine, in the repo root, both ignored by git and carried to the GPU machine:
#   .gpu/tok/  the embedded model's tokenizer.json, tokenizer_config.json, chat_template.jinja, config.json and
#              generation_config.json (from ~/.cache/minivllm/SmolLM2-135M-Instruct.*/)
#   .whl/      cp312 wheels of what the GPU image lacks (pip download --no-deps --only-binary=:all: --python-version 3.12
#              --platform manylinux2014_x86_64 ...): fastcore fastapi starlette pydantic pydantic_core annotated-types
#              typing-inspection uvicorn gguf xgrammar apache-tvm-ffi openai jiter httpx2 httpcore2 truststore
#              opentelemetry-api typing_extensions annotated-doc
set -x
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD HF_HUB_OFFLINE=1 MINIVLLM_TOKENIZER_DIR=$PWD/.gpu/tok PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
python3 -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__, torch.cuda.get_device_name())"
MV='import sys; from minivllm.serve.cli import main; sys.exit(main(sys.argv[1:]))'
has() { [[ ",${STAGE}," == *",$1,"* ]]; }
has tests && timeout 330 python3 -m pytest -q -rs --timeout 200 tests/test_gpu.py -p no:cacheprovider 2>&1 | tee $OUT/gpu_tests.log | tail -40
has kernels && timeout 150 python3 .ci/gpu/kernel_bench.py $OUT/kernels_h100.json 2>&1 | tail -30
python3 .ci/gpu/smol.py /tmp/smol
has startup && timeout 300 python3 .ci/gpu/startup.py $OUT/compile_h100.json
if has bench; then
timeout 150 python3 -c "$MV" bench throughput --model /tmp/smol --device cuda --num-prompts 256 --systems minivllm hf-generate --hf-batch-size 32 --enforce-eager --json $OUT/throughput_eager_h100.json 2>&1 | tail -12
timeout 150 python3 -c "$MV" bench throughput --model /tmp/smol --device cuda --num-prompts 256 --systems minivllm --no-enforce-eager --json $OUT/throughput_graphs_h100.json 2>&1 | tail -12
timeout 120 python3 -c "$MV" bench latency --model /tmp/smol --device cuda --concurrency 1 16 --systems minivllm hf-generate --enforce-eager --json $OUT/latency_eager_h100.json 2>&1 | tail -12
timeout 120 python3 -c "$MV" bench latency --model /tmp/smol --device cuda --concurrency 1 16 --systems minivllm --no-enforce-eager --json $OUT/latency_graphs_h100.json 2>&1 | tail -12
fi
if has real; then
BUILD_ON=cuda python3 .ci/gpu/real_size.py --build /tmp/m1b --shape 1b; BUILD_ON=cuda python3 .ci/gpu/real_size.py --build /tmp/m8b --shape 8b
timeout 165 python3 .ci/gpu/real_size.py $OUT/rs1b.json compiled --model /tmp/m1b --budget 155
timeout 75 python3 .ci/gpu/profile_decode.py /tmp/m1b $OUT/prof1b.json
timeout 195 python3 .ci/gpu/real_size.py $OUT/rs8b.json compiled --model /tmp/m8b --batches 1,8,32,128 --no-nano --budget 185
GC_FREEZE=0 timeout 75 python3 .ci/gpu/real_size.py $OUT/gc0.json compiled --model /tmp/m1b --batches 1,128,256 --no-nano --budget 70
fi
exit 0
