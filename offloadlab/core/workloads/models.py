"""TaskGraphs of real networks, traced from PyTorch once and shipped as package data
(``offloadlab/data/models``, made by ``export.py`` there with :func:`.from_torch.from_torch`)."""

from __future__ import annotations

from importlib import resources

from ..errors import SpecError
from ..formats import taskgraph_from_json
from ..taskgraph import TaskGraph
from .registry import workload

MODELS = ("mlp", "resnet18", "bert", "gpt2", "llama")
MODES = ("infer", "train")
GPUS = (1, 2, 3)


@workload("model")
def model(name: str = "gpt2", mode: str = "infer", gpus: int = 1) -> TaskGraph:
    """A small MLP, ResNet-18, BERT, GPT-2 or LLaMA traced from PyTorch: its forward pass
    (``infer``) or one training step (``train``: forward, cross-entropy, backward, an Adam
    update per weight), placed as a pipeline on 1-3 GPUs; weights and inputs in host RAM.

    Parameters
    ----------
    name : str
        ``mlp``, ``resnet18``, ``bert``, ``gpt2`` or ``llama``.
    mode : str
        ``infer`` or ``train``.
    gpus : int
        1, 2 or 3.

    Returns
    -------
    TaskGraph
        Read from the shipped file.

    Raises
    ------
    SpecError
        An unknown name, mode or GPU count.
    """
    for key, value, known in (("name", name, MODELS), ("mode", mode, MODES), ("gpus", gpus, GPUS)):
        if value not in known:
            raise SpecError(f"model: unknown {key} {value!r}; known: "
                            f"{', '.join(map(str, known))}")
    data = resources.files("offloadlab") / "data" / "models" / f"{name}-{mode}-g{gpus}.json"
    with resources.as_file(data) as path:
        return taskgraph_from_json(path)
