"""Character-level tokenizer: every character of an alphabet is one token.

Used by the built-in arithmetic demo and by SMILES generators, where a subword vocabulary would
hide the structure the model has to learn (digits of a number, atoms and bonds of a molecule).
The result is an ordinary ``transformers.PreTrainedTokenizerFast``: it saves with
``save_pretrained`` and loads back with ``AutoTokenizer.from_pretrained`` from a local folder.
"""

from __future__ import annotations

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

PAD_TOKEN = "<pad>"
BOS_TOKEN = "<bos>"
EOS_TOKEN = "<eos>"
UNK_TOKEN = "<unk>"
SPECIAL_TOKENS = (PAD_TOKEN, BOS_TOKEN, EOS_TOKEN, UNK_TOKEN)


def build_char_tokenizer(alphabet: str, add_bos: bool = True) -> PreTrainedTokenizerFast:
    """Build a tokenizer with one token per character of ``alphabet``.

    Ids 0-3 are ``<pad>``, ``<bos>``, ``<eos>``, ``<unk>``; the alphabet's characters follow in
    order of first appearance (duplicates are ignored). A character outside the alphabet maps to
    ``<unk>``. With ``add_bos`` every encoded text starts with ``<bos>`` (when
    ``add_special_tokens=True``, the default), so an empty prompt still gives the model a first
    token to condition on; ``<eos>`` is never added automatically because generated completions
    must learn to emit it themselves.
    """
    chars = list(dict.fromkeys(alphabet))
    if not chars:
        raise ValueError("alphabet must contain at least one character")
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for ch in chars:
        vocab[ch] = len(vocab)

    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK_TOKEN))
    # Split into single characters, keeping whitespace as ordinary tokens.
    core.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    core.decoder = decoders.Fuse()
    if add_bos:
        bos_id = vocab[BOS_TOKEN]
        core.post_processor = processors.TemplateProcessing(
            single=f"{BOS_TOKEN} $A",
            pair=f"{BOS_TOKEN} $A $B",
            special_tokens=[(BOS_TOKEN, bos_id)],
        )
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token=PAD_TOKEN,
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        unk_token=UNK_TOKEN,
        padding_side="left",
        clean_up_tokenization_spaces=False,
    )
