from gpuscope.core.common.redact import MASK, redact_args, redact_command, redact_text


def test_secret_options_mask_the_next_argument():
    assert redact_args(["serve", "--api-key", "sk-1", "--token", "t0k", "--password", "p", "--port", "80"]) == [
        "serve", "--api-key", MASK, "--token", MASK, "--password", MASK, "--port", "80",
    ]


def test_secret_assignments_and_env_style_values():
    line = redact_command(["run", "--token=abc", "password=hunter2", "HF_TOKEN=hf_1", "OPENAI_API_KEY=sk", "PATH=/bin"])
    assert "abc" not in line and "hunter2" not in line and "hf_1" not in line and "=sk" not in line
    assert "PATH=/bin" in line


def test_authorization_header_and_url_credentials():
    assert redact_text("Authorization: Bearer abcdefghijklmnop") == f"Authorization: {MASK}"
    assert redact_text("https://bob:s3cret@db.internal:5432/x") == f"https://bob:{MASK}@db.internal:5432/x"
    assert "hunter2" not in redact_text("postgres://u@h/db?password=hunter2&x=1")


def test_ordinary_options_are_left_alone():
    argv = ["vllm", "serve", "m", "--max-tokens", "100", "--tokenizer", "t", "--keyfile", "k.pem"]
    assert redact_args(argv) == argv


def test_a_joined_string_is_split_before_redaction():
    assert redact_command("python serve.py --api-key sk-99 --port 1") == f"python serve.py --api-key {MASK} --port 1"
