"""A base URL as lunasol keeps and shows it: no credential, everything else byte for byte."""

from __future__ import annotations

import pytest

from pipeline.core.urls import PASSWORD_MARK, VALUE_MARK, is_shown, shown_url, shown_urls


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("https://user:pw-123@proxy.example/v1", f"https://user:{PASSWORD_MARK}@proxy.example/v1"),
        ("https://ghp_tokenonly@proxy.example:8443/v1", f"https://{PASSWORD_MARK}@proxy.example:8443/v1"),
        ("http://u:p@ss@127.0.0.1:8000/v1", f"http://u:{PASSWORD_MARK}@127.0.0.1:8000/v1"),  # '@' in the password
        ("https://x.azure.example/openai?api-key=abc123&api-version=2024-06-01",
         f"https://x.azure.example/openai?api-key={VALUE_MARK}&api-version=2024-06-01"),
        ("https://h/v1?apiKey=a&access_token=b&sig=c&X-Amz-Signature=d&key=e",
         f"https://h/v1?apiKey={VALUE_MARK}&access_token={VALUE_MARK}&sig={VALUE_MARK}"
         f"&X-Amz-Signature={VALUE_MARK}&key={VALUE_MARK}"),
    ],
)  # fmt: skip
def test_credentials_in_a_url_are_marked(url: str, shown: str) -> None:
    assert shown_url(url) == shown
    assert is_shown(shown) and not is_shown(url)
    assert shown_url(shown) == shown  # marking twice changes nothing


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:8000/v1",
        "https://api.openai.com/v1/",
        "https://h/v1?api-version=2024-06-01&model=m&keyboard=1&monkey=2&key=",  # not credential names, or no value
        "https://h/v1?a=%20b&&c",  # odd query bytes are kept as they are
        "http://[::1]:8080/v1#frag",
    ],
)
def test_a_url_without_credentials_is_kept_byte_for_byte(url: str) -> None:
    assert shown_url(url) == url
    assert not is_shown(url)


def test_urls_inside_a_message_are_marked_and_the_rest_kept() -> None:
    text = "Cannot connect to host https://u:pw-9@proxy/v1?api-key=k-1 (see 'http://docs.example/x'): refused"
    assert shown_urls(text) == (
        f"Cannot connect to host https://u:{PASSWORD_MARK}@proxy/v1?api-key={VALUE_MARK} "
        "(see 'http://docs.example/x'): refused"
    )
    assert shown_urls("no url here") == "no url here"
