"The console script, as a user runs it."
import subprocess, sys


def test_minivllm_generate_runs_the_embedded_model():
    r = subprocess.run(["minivllm", "generate", "--max-tokens", "8", "--raw", "The capital of France is"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    assert "Paris" in r.stdout
    assert "tokens/s" in r.stderr


def test_minivllm_generate_bad_flag_value_is_a_clear_error():
    r = subprocess.run(["minivllm", "generate", "--max-tokens", "0", "hi"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 2 and "max_tokens" in r.stderr
