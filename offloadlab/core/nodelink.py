"""Node-link JSON and networkx export, the plumbing TaskGraph and MemGraph share
(docs/design.md, Interchange).  Each graph hands over its node-link parts, ``(graph, nodes,
edges)``: the ``graph`` attributes (``type`` first) and iterators of node and edge dicts."""

from __future__ import annotations

import io
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import orjson

from .checks import write_node_link
from .errors import GraphError
from .util import no_gc


def as_dict(graph: dict, nodes: Iterable[dict], edges: Iterable[dict]) -> dict:
    """Node-link data as one dict (``networkx.node_link_data``'s layout, ``edges`` key)."""
    return {"directed": True, "multigraph": False, "graph": graph, "nodes": list(nodes),
            "edges": list(edges)}


def to_networkx(graph: dict, nodes: Iterable[dict], edges: Iterable[dict]):
    """A networkx DiGraph: the ``graph`` attributes, each node's fields but its id as node
    attributes, each edge's ``kind``."""
    import networkx as nx
    g = nx.DiGraph(**graph)
    g.add_nodes_from((n["id"], {k: v for k, v in n.items() if k != "id"}) for n in nodes)
    g.add_edges_from((e["source"], e["target"], {"kind": e["kind"]}) for e in edges)
    return g


def write(graph: dict, nodes: Iterable[dict], edges: Iterable[dict], path: str | Path | None,
          what: str) -> str | None:
    """Strict node-link JSON (no NaN or Infinity) as text, or written to ``path``."""
    if path is None:
        out = io.BytesIO()
        write_node_link(out, graph, nodes, edges, what)
        return out.getvalue().decode()
    with open(path, "wb") as f:
        write_node_link(f, graph, nodes, edges, what)
    return None


def read(text_or_path: str | Path, what: str) -> tuple[Any, str]:
    """Parse JSON from a string or a path, raising GraphError that names the file."""
    where = what
    text = str(text_or_path)
    if isinstance(text_or_path, Path) or not text.lstrip().startswith("{"):
        path = Path(text_or_path)
        where = f"{what} file {str(path)!r}"
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise GraphError(f"cannot read {where}: {exc.strerror or exc}") from None
        except UnicodeDecodeError as exc:
            raise GraphError(f"{where}: not UTF-8 text ({exc.reason} at byte {exc.start})"
                             ) from None
    try:
        with no_gc():                       # millions of small objects, none of them cyclic
            try:
                return orjson.loads(text), where
            except orjson.JSONDecodeError:  # NaN, Infinity, huge integers, or malformed:
                return json.loads(text), where   # the field checks or json's message say which
    except json.JSONDecodeError as exc:
        raise GraphError(f"{where}: malformed JSON ({exc})") from None
    except RecursionError:
        raise GraphError(f"{where}: malformed JSON (nested too deeply)") from None
    except ValueError as exc:   # e.g. an integer of more than 4300 digits
        raise GraphError(f"{where}: malformed JSON ({exc})") from None
