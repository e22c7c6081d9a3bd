import os

import anthropic
import openai
import pytest

URL = os.environ.get("FLASHSEEK_URL", "http://127.0.0.1:8000")
KEY = os.environ.get("FLASHSEEK_API_KEY", "none")
MODEL = "flashseek-default"


@pytest.fixture(scope="session")
def oai():
    return openai.OpenAI(base_url=URL + "/v1", api_key=KEY, max_retries=0, timeout=120)


@pytest.fixture(scope="session")
def claude():
    return anthropic.Anthropic(base_url=URL, api_key=KEY, max_retries=0, timeout=120)
