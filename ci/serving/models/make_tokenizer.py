"""Make the small word-level tokenizer the TPOT benchmark ships (run once; its output is committed).

``vllm bench serve --dataset-name random`` samples token ids, decodes them to text and
encodes the text again: any tokenizer whose ids round-trip will do. This one has
``VOCAB_SIZE`` entries: four special tokens and the words ``w4`` ... ``w16383``.

Usage: ``python ci/serving/models/make_tokenizer.py`` (needs the ``tokenizers`` package).
"""

import json
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers

VOCAB_SIZE = 16384
SPECIAL = ["<unk>", "<s>", "</s>", "<pad>"]
HERE = Path(__file__).resolve().parent / "tokenizer"


def main() -> None:
    vocab = {tok: i for i, tok in enumerate(SPECIAL)}
    vocab.update({f"w{i}": i for i in range(len(SPECIAL), VOCAB_SIZE)})
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins words with spaces
    HERE.mkdir(exist_ok=True)
    tok.save(str(HERE / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "pad_token": "<pad>",
        "model_max_length": 8192,
        "clean_up_tokenization_spaces": False,
    }
    (HERE / "tokenizer_config.json").write_text(json.dumps(config, indent=1) + "\n")


if __name__ == "__main__":
    main()
