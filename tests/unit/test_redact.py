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


def test_a_name_of_digits_or_separators_only_names_no_secret():
    from gpuscope.core.common.redact import is_secret_name
    assert not is_secret_name("2") and not is_secret_name("_") and is_secret_name("TOKEN_2")


def test_a_quoted_secret_keeps_its_quotes_and_an_unclosed_one_stays_unclosed():
    assert redact_text('password="abc"') == f'password="{MASK}"'
    assert redact_text('password="abc') == f'password="{MASK}'
    assert redact_text('token="') == f'token="{MASK}'


def test_bearer_and_basic_credentials_anywhere_in_text():
    assert redact_text("sent Bearer abc.def-123 to it") == f"sent Bearer {MASK} to it"
    assert redact_text("sent basic dXNlcjpwYXNzd29yZA== to it") == f"sent basic {MASK} to it"


def test_program_options_attached_or_with_an_equals_sign():
    assert redact_args(["mysql", "-px", "db"]) == ["mysql", f"-p{MASK}", "db"]
    assert redact_args(["mysql", "-pPW", "db"]) == ["mysql", f"-p{MASK}", "db"]
    assert redact_args(["curl", "-ubob:pw", "x"]) == ["curl", f"-ubob:{MASK}", "x"]
    assert redact_args(["curl", "--user=bob:pw", "x"]) == ["curl", f"--user=bob:{MASK}", "x"]


def test_only_words_shaped_like_options_are_options():
    assert redact_args(["x", "---password", "y"]) == ["x", "---password", "y"]
    assert redact_args(["x", "--2password", "y"]) == ["x", "--2password", "y"]
    assert redact_args(["x", "-t", "y"]) == ["x", "-t", "y"]
    assert redact_args(["x", "--password", "y"]) == ["x", "--password", MASK]


def test_an_assignment_masks_its_whole_value_spaces_too():
    assert redact_args(["env", "API_TOKEN=a b c", "x"]) == ["env", f"API_TOKEN={MASK}", "x"]


def test_an_empty_argument_is_quoted_in_a_command_line():
    assert redact_command(["a", "", "b"]) == "a '' b"


def test_only_gpuscope_s_own_credentials_leave_its_childrens_environment():
    from gpuscope.core.common.redact import without_own_secrets
    env = {"GPUSCOPE_PROMETHEUS_TOKEN": "t", "GPUSCOPE_PROMETHEUS_USER": "u", "GPUSCOPE_REFRESH": "1",
           "API_TOKEN": "a", "PATH": "/bin"}
    assert without_own_secrets(env) == {"GPUSCOPE_REFRESH": "1", "API_TOKEN": "a", "PATH": "/bin"}


def test_an_empty_quoted_secret_keeps_both_quotes():
    assert redact_text('password=""') == f'password="{MASK}"'


def test_a_scheme_word_after_a_secret_name_does_not_leave_the_token_behind():
    for text in ("X-Auth: Bearer abc.def-123", "api_key=Basic QWxhZGRpbjpvcGVuc2VzYW1l"):
        masked = redact_text(text)
        assert "abc.def-123" not in masked and "QWxhZGRpbjpvcGVuc2VzYW1l" not in masked, masked
