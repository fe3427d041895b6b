#!/usr/bin/env python3
"""Write a random-weight Llama-architecture GGUF pair, a target and its draft, for llama-server.

Adapted from the recipe in ../shared/real-engine. The draft is the target's first
``--draft-layers`` layers with the same embeddings, final norm and output head. The target's other
layers have their residual-branch output projections (attn_output, ffn_down) scaled by ``--eps``,
so the target's greedy choice usually equals the draft's: larger eps, lower acceptance (0.05 gives
~0.67 per draft token). The vocabulary is a 512-piece SentencePiece one with byte fallback and
``▁hello`` as one piece, so the synthetic prompts of ``spec-router calibrate`` and the load
generators ("hello hello ...") are about one token per word. Rows of the output head for special,
byte and unused pieces are zeroed: no end-of-sequence, always valid UTF-8. Same seed, same bytes.
"""

from __future__ import annotations

import argparse
import os

import gguf
import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf import TokenType as TT

QTYPES = {"f32": Q.F32, "f16": Q.F16, "q8_0": Q.Q8_0}
FILE_TYPES = {
    Q.F32: gguf.LlamaFileType.ALL_F32,
    Q.F16: gguf.LlamaFileType.MOSTLY_F16,
    Q.Q8_0: gguf.LlamaFileType.MOSTLY_Q8_0,
}
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)
BIGRAMS = (
    "th he in er an re on at en nd ti es or te of ed is it al ar st to nt ng se ha as ou io le "
    "ve co me de hi ri ro ic ne ea ra ce"
).split()


def vocabulary() -> tuple[list[str], list[float], list[TT]]:
    tokens: list[str] = []
    scores: list[float] = []
    types: list[TT] = []

    def add(text: str, score: float, kind: TT) -> None:
        tokens.append(text)
        scores.append(score)
        types.append(kind)

    add("<unk>", 0.0, TT.UNKNOWN)
    add("<s>", 0.0, TT.CONTROL)
    add("</s>", 0.0, TT.CONTROL)
    for b in range(256):
        add(f"<0x{b:02X}>", 0.0, TT.BYTE)
    add("\u2581", -1.0, TT.NORMAL)
    for c in range(33, 127):
        add(chr(c), -2.0, TT.NORMAL)
    for c in "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ":
        add("\u2581" + c, -1.5, TT.NORMAL)
    for i, pair in enumerate(BIGRAMS):
        add(pair, -1.2 - 0.001 * i, TT.NORMAL)
        add("\u2581" + pair, -1.1 - 0.001 * i, TT.NORMAL)
    # SentencePiece merges pairs of pieces that are both in the vocabulary: "▁hello" needs the
    # steps to it ("▁he" is a bigram above).
    for i, piece in enumerate(("\u2581hel", "\u2581hell", "\u2581hello")):
        add(piece, -0.7 + 0.1 * i, TT.NORMAL)
    while len(tokens) % 32:
        add(f"<unused{len(tokens)}>", -100.0, TT.UNUSED)
    return tokens, scores, types


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--out", required=True, help="directory for target.gguf and draft.gguf")
    p.add_argument("--n-embd", type=int, default=1024)
    p.add_argument("--n-ff", type=int, default=2816)
    p.add_argument("--n-layer", type=int, default=10)
    p.add_argument("--n-head", type=int, default=16)
    p.add_argument("--n-head-kv", type=int, default=4)
    p.add_argument("--draft-layers", type=int, default=1)
    p.add_argument("--eps", type=float, default=0.05)
    p.add_argument("--qtype", default="f32", choices=sorted(QTYPES))
    p.add_argument("--draft-qtype", default="q8_0", choices=sorted(QTYPES))
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--ctx", type=int, default=4096)
    a = p.parse_args()

    rng = np.random.default_rng(a.seed)
    tokens, scores, types = vocabulary()
    n_vocab, width, head_dim = len(tokens), a.n_embd, a.n_embd // a.n_head

    def w(rows: int, cols: int, scale: float = 1.0) -> np.ndarray:
        x = rng.standard_normal((rows, cols), dtype=np.float32) * (scale / np.sqrt(cols))
        return x.astype(np.float32)

    emb = rng.standard_normal((n_vocab, width), dtype=np.float32).astype(np.float32)
    out = w(n_vocab, width) * 4.0
    for i, kind in enumerate(types):
        if kind != TT.NORMAL:
            out[i] = 0.0  # logit 0 against a spread of ~4: never chosen
    layers = []
    for i in range(a.n_layer):
        s = 1.0 if i < a.draft_layers else a.eps
        layers.append(
            {
                "attn_norm.weight": np.ones(width, np.float32),
                "attn_q.weight": w(width, width),
                "attn_k.weight": w(a.n_head_kv * head_dim, width),
                "attn_v.weight": w(a.n_head_kv * head_dim, width),
                "attn_output.weight": w(width, width, s),
                "ffn_norm.weight": np.ones(width, np.float32),
                "ffn_gate.weight": w(a.n_ff, width),
                "ffn_up.weight": w(a.n_ff, width),
                "ffn_down.weight": w(width, a.n_ff, s),
            }
        )

    def write(path: str, n_layer: int, name: str, qt: Q) -> None:
        wr = gguf.GGUFWriter(path, "llama")
        wr.add_name(name)
        wr.add_context_length(a.ctx)
        wr.add_embedding_length(width)
        wr.add_block_count(n_layer)
        wr.add_feed_forward_length(a.n_ff)
        wr.add_head_count(a.n_head)
        wr.add_head_count_kv(a.n_head_kv)
        wr.add_rope_dimension_count(head_dim)
        wr.add_rope_freq_base(10000.0)
        wr.add_layer_norm_rms_eps(1e-5)
        wr.add_vocab_size(n_vocab)
        wr.add_file_type(FILE_TYPES[qt])
        wr.add_tokenizer_model("llama")
        wr.add_tokenizer_pre("default")
        wr.add_token_list(tokens)
        wr.add_token_scores(scores)
        wr.add_token_types(types)
        wr.add_bos_token_id(1)
        wr.add_eos_token_id(2)
        wr.add_unk_token_id(0)
        wr.add_add_bos_token(True)
        wr.add_add_space_prefix(True)
        wr.add_chat_template(CHAT_TEMPLATE)

        def tensor(key: str, arr: np.ndarray) -> None:
            if arr.ndim == 2 and qt == Q.Q8_0:
                wr.add_tensor(key, gguf.quants.quantize(arr, qt), raw_dtype=qt)
            elif arr.ndim == 2 and qt == Q.F16:
                wr.add_tensor(key, arr.astype(np.float16))
            else:
                wr.add_tensor(key, arr.astype(np.float32))

        tensor("token_embd.weight", emb)
        tensor("output_norm.weight", np.ones(width, np.float32))
        tensor("output.weight", out)
        for i in range(n_layer):
            for key, value in layers[i].items():
                tensor(f"blk.{i}.{key}", value)
        wr.write_header_to_file()
        wr.write_kv_data_to_file()
        wr.write_tensors_to_file()
        wr.close()
        print("wrote", path)

    os.makedirs(a.out, exist_ok=True)
    write(f"{a.out}/target.gguf", a.n_layer, "spec-test-target", QTYPES[a.qtype])
    write(f"{a.out}/draft.gguf", a.draft_layers, "spec-test-draft", QTYPES[a.draft_qtype])
    print("n_vocab", n_vocab)


if __name__ == "__main__":
    main()
