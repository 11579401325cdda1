"""Token counting: the model's tokenizer.json when there is one, else the documented estimate."""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer, models, pre_tokenizers

from inferencepool.engine_sim.tokenizer import EstimateTokenizer, HFTokenizer, load_tokenizer, render_chat


def test_estimate_splits_words_every_four_characters() -> None:
    tokenizer = EstimateTokenizer()
    assert len(tokenizer.encode("a bb ccc dddd")) == 4
    assert len(tokenizer.encode("extraordinary")) == 4  # extr aord inar y
    assert len(tokenizer.encode("Hello, world!")) == 6  # Hell o , worl d !
    assert tokenizer.encode("same text") == EstimateTokenizer().encode("same text")  # stable across processes


def test_output_pieces_are_deterministic_words() -> None:
    tokenizer = EstimateTokenizer()
    pieces = [tokenizer.output_piece(42, i) for i in range(5)]
    assert pieces == [tokenizer.output_piece(42, i) for i in range(5)]
    assert all(p.startswith(" ") and p.strip().isalpha() for p in pieces)


def test_a_tokenizer_json_is_used_when_found(tmp_path: Path) -> None:
    vocab = {"[UNK]": 0, "hello": 1, "world": 2, "the": 3, "engine": 4}
    hf = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    hf.pre_tokenizer = pre_tokenizers.Whitespace()
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    hf.save(str(model_dir / "tokenizer.json"))

    loaded = load_tokenizer(None, str(model_dir))  # found in the model directory
    assert isinstance(loaded, HFTokenizer)
    assert loaded.encode("hello world hello") == [1, 2, 1]
    assert loaded.name == f"hf:{model_dir / 'tokenizer.json'}"
    assert isinstance(load_tokenizer(str(model_dir / "tokenizer.json")), HFTokenizer)
    assert isinstance(load_tokenizer(None, "meta-llama/not-a-local-path"), EstimateTokenizer)


def test_special_tokens_count_once() -> None:
    tokenizer = EstimateTokenizer()
    assert (
        len(tokenizer.encode("<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>"))
        == 6
    )
    # a chat message costs its text plus 4 template tokens, as a Llama 3 tokenizer counts it
    one = tokenizer.encode(render_chat([{"role": "user", "content": "hi"}], add_generation_prompt=False))
    two = tokenizer.encode(
        render_chat(
            [{"role": "user", "content": "hi"}, {"role": "user", "content": "hi"}],
            add_generation_prompt=False,
        )
    )
    assert len(two) - len(one) == 4 + 1


def test_chat_template_adds_headers() -> None:
    text = render_chat([{"role": "user", "content": [{"type": "text", "text": "hi"}]}])
    assert text.startswith("<|begin_of_text|><|start_header_id|>user<|end_header_id|>")
    assert text.endswith("<|start_header_id|>assistant<|end_header_id|>\n\n")
    assert "hi<|eot_id|>" in text
