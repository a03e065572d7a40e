"""Character tokenizer: one token per character, special tokens, save and reload."""

from transformers import AutoTokenizer

from grpokit.data.char_tokenizer import build_char_tokenizer


def test_one_token_per_character_with_bos():
    tok = build_char_tokenizer("0123456789+=")
    # ids: 0 pad, 1 bos, 2 eos, 3 unk, then "0".."9" = 4..13, "+" = 14, "=" = 15
    assert tok("12+3=")["input_ids"] == [1, 5, 6, 14, 7, 15]
    assert tok("12", add_special_tokens=False)["input_ids"] == [5, 6]
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id, tok.unk_token_id) == (0, 1, 2, 3)
    assert len(tok) == 16


def test_spaces_and_unknown_characters():
    tok = build_char_tokenizer("ab ")
    # a=4, b=5, " "=6; "z" is unknown (3)
    assert tok("a  bz", add_special_tokens=False)["input_ids"] == [4, 6, 6, 5, 3]


def test_duplicates_in_alphabet_are_ignored():
    assert len(build_char_tokenizer("aab")) == 4 + 2


def test_round_trip_and_eos_decoding():
    tok = build_char_tokenizer("CNOH()=1#[]@+c")
    text = "C1=CC(=O)N[C@@H]1"
    ids = tok(text)["input_ids"]
    assert len(ids) == len(text) + 1
    assert tok.decode(ids, skip_special_tokens=True) == text
    assert tok.decode(tok("CO", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]) == "CO<eos>"


def test_without_bos():
    tok = build_char_tokenizer("xy", add_bos=False)
    assert tok("xy")["input_ids"] == [4, 5]


def test_left_padding_for_generation():
    tok = build_char_tokenizer("0123456789")
    batch = tok(["1", "234"], padding=True)
    assert batch["input_ids"] == [[0, 0, 1, 5], [1, 6, 7, 8]]
    assert batch["attention_mask"] == [[0, 0, 1, 1], [1, 1, 1, 1]]


def test_save_and_load_with_auto_tokenizer(tmp_path):
    tok = build_char_tokenizer("0123456789+-=")
    tok.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    for text in ["12+30=", "7-9=", ""]:
        assert loaded(text)["input_ids"] == tok(text)["input_ids"]
    assert loaded.eos_token_id == tok.eos_token_id and loaded.pad_token_id == tok.pad_token_id
    assert loaded.padding_side == "left"
    assert loaded.decode(loaded("5+5=")["input_ids"], skip_special_tokens=True) == "5+5="
