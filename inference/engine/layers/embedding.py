"""The token embedding table of a decoder, allocated for the loader to fill."""
import torch
from torch import nn


def embedding_table(vocab_size: int, hidden_size: int) -> nn.Embedding:
    """An nn.Embedding of [vocab_size, hidden_size] whose table is allocated (on the current device, the
    loader's meta device) and not initialised: load_model assigns the checkpoint's weights over it.

    nn.Embedding's own initialisation draws normal_, which on the meta device runs torch's reference
    implementation and imports torch._dynamo on first use: 1.5-2 s of every process that loads a model,
    for numbers nobody reads. Returns the module; raises nothing beyond torch's own allocation errors.
    """
    return nn.Embedding(vocab_size, hidden_size, _weight=torch.empty(vocab_size, hidden_size))
