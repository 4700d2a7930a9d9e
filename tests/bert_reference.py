"""PyTorch references for caccel's BERT: Hugging Face transformers when it imports, else a
hand-written BertModel / BertForSequenceClassification (eager attention, as transformers'),
loaded from the same config.json and model.safetensors."""
import json
import math
import os

import torch
import torch.nn.functional as F

try:
    import transformers
except ImportError:
    transformers = None
if os.environ.get("CACCEL_BERT_REFERENCE") == "hand":   # force the hand-written reference
    transformers = None


def _load_state(d):
    from safetensors.torch import load_file
    return load_file(os.path.join(d, "model.safetensors"))


class HandBert:
    """BertModel (+ the classification head when the file has one), written from the paper's and
    transformers' definitions; parameters read by Hugging Face's names."""

    def __init__(self, d):
        self.c = json.load(open(os.path.join(d, "config.json")))
        sd = _load_state(d)
        self.prefix = "bert." if any(k.startswith("bert.") for k in sd) else ""
        self.sd = {k: v.float() for k, v in sd.items() if v.is_floating_point()}

    def p(self, name):
        return self.sd[self.prefix + name]

    def lin(self, x, name):
        return F.linear(x, self.p(name + ".weight"), self.p(name + ".bias"))

    def ln(self, x, name):
        h = x.shape[-1]
        return F.layer_norm(x, (h,), self.p(name + ".weight"), self.p(name + ".bias"),
                            self.c.get("layer_norm_eps", 1e-12))

    def bert(self, ids, mask, types):
        c = self.c
        b, length = ids.shape
        heads = c["num_attention_heads"]
        e = (self.p("embeddings.word_embeddings.weight")[ids]
             + self.p("embeddings.position_embeddings.weight")[torch.arange(length)][None]
             + self.p("embeddings.token_type_embeddings.weight")[types])
        h = self.ln(e, "embeddings.LayerNorm")
        add = (1.0 - mask[:, None, None, :].float()) * torch.finfo(torch.float32).min
        for i in range(c["num_hidden_layers"]):
            n = "encoder.layer.%d." % i

            def split(x):
                return x.view(b, length, heads, -1).transpose(1, 2)
            q, k, v = (split(self.lin(h, n + "attention.self." + w)) for w in ("query", "key", "value"))
            s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]) + add
            ctx = (s.softmax(-1) @ v).transpose(1, 2).reshape(b, length, -1)
            a = self.ln(self.lin(ctx, n + "attention.output.dense") + h, n + "attention.output.LayerNorm")
            act = F.gelu(self.lin(a, n + "intermediate.dense"))
            h = self.ln(self.lin(act, n + "output.dense") + a, n + "output.LayerNorm")
        pooled = torch.tanh(self.lin(h[:, 0], "pooler.dense"))
        return h, pooled

    def logits(self, ids, mask):
        _, pooled = self.bert(ids, mask, torch.zeros_like(ids))
        return F.linear(pooled, self.sd["classifier.weight"], self.sd["classifier.bias"])


def which():
    return "transformers %s" % transformers.__version__ if transformers else "hand-written PyTorch BertModel"


def bert_outputs(d, ids, mask, types):
    """(last_hidden_state, pooler_output) of the BertModel in directory d."""
    with torch.no_grad():
        if transformers:
            m = transformers.BertModel.from_pretrained(d, attn_implementation="eager").eval()
            o = m(input_ids=ids, attention_mask=mask, token_type_ids=types)
            return o.last_hidden_state, o.pooler_output
        return HandBert(d).bert(ids, mask, types)


def classifier_logits(d, ids, mask):
    """Logits of the BertForSequenceClassification checkpoint in directory d."""
    with torch.no_grad():
        if transformers:
            m = transformers.BertForSequenceClassification.from_pretrained(d, attn_implementation="eager").eval()
            return m(input_ids=ids, attention_mask=mask).logits
        return HandBert(d).logits(ids, mask)
