"""Render a kustomization in pure Python: the small subset of kustomize this repository uses.

Why: the tests check the manifests as `kubectl apply -k` would send them, without a kustomize
binary, a cluster or the network. Every field outside the subset raises `KustomizeError`, so a
kustomization cannot use a feature that this renderer would silently skip; `kubectl kustomize`
remains the authority (the two must agree on everything below).

Supported `kustomization.yaml` fields (plus `apiVersion`/`kind`):

- `resources`: local YAML files (several documents each) and directories holding a
  kustomization.yaml, rendered recursively as bases. No remote URLs.
- `patches`: each from `path` (relative to the kustomization) or inline `patch`, with an optional
  `target` (`group`, `version`, `kind`, `name`; no selectors).
  - A patch that parses to a list is JSON6902: ops `add`, `remove`, `replace`, `test`, RFC 6901
    pointers (`~0`, `~1`, `-` to append). It needs a `target`.
  - Otherwise it is a strategic-merge patch, aimed at the object with its own
    apiVersion/kind/metadata.name (or at `target`). Mappings merge recursively and `null` deletes
    a key. A patch containing a list of mappings, or a `$patch`-style directive, is refused:
    kustomize merges such lists by schema-dependent keys (and replaces them in custom resources
    such as RayService), and this renderer does not guess; use JSON6902 for lists.
- `namespace`: set on the metadata of every namespaced object.
- `images`: entries with `name` and `newName` / `newTag` / `digest`, applied to `image` in every
  `containers` and `initContainers` list anywhere in an object, as kustomize's default image
  transformer does (so it reaches the pod templates inside a RayService); `newTag` and `digest`
  together give `name:tag@digest`, one alone replaces both the old tag and digest.

Order: resources, then patches (in the order listed), then namespace, then images.

    python k8s/render_kustomize.py k8s/overlays/cpu-dev   # print the rendered YAML stream
"""

from __future__ import annotations

import copy
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

Obj = dict[str, Any]

_SUPPORTED_FIELDS = {"apiVersion", "kind", "resources", "patches", "namespace", "images"}
_TARGET_FIELDS = {"group", "version", "kind", "name"}
# Kinds the namespace transformer leaves alone (only those this repository could plausibly use).
_CLUSTER_SCOPED = {
    "Namespace",
    "CustomResourceDefinition",
    "ClusterRole",
    "ClusterRoleBinding",
    "PriorityClass",
    "StorageClass",
    "PersistentVolume",
}


class KustomizeError(ValueError):
    """The kustomization uses something outside the supported subset, or a patch fails."""


def render(directory: str | Path) -> list[Obj]:
    """Objects produced by the kustomization in `directory`, in resource order."""
    root = Path(directory)
    kfile = root / "kustomization.yaml"
    if not kfile.is_file():
        raise KustomizeError(f"{root}: no kustomization.yaml")
    spec = yaml.safe_load(kfile.read_text(encoding="utf-8")) or {}
    unknown = set(spec) - _SUPPORTED_FIELDS
    if unknown:
        raise KustomizeError(f"{kfile}: unsupported fields {sorted(unknown)}")

    objects: list[Obj] = []
    for entry in spec.get("resources", []):
        if "://" in entry or entry.startswith("github.com/"):
            raise KustomizeError(f"{kfile}: remote resource {entry!r} is not supported")
        path = root / entry
        if path.is_dir():
            objects.extend(render(path))
        else:
            objects.extend(_load_objects(path))

    for patch in spec.get("patches", []):
        _apply_patch(objects, patch, root)

    namespace = spec.get("namespace")
    if namespace:
        for obj in objects:
            if obj.get("kind") not in _CLUSTER_SCOPED:
                obj.setdefault("metadata", {})["namespace"] = namespace

    for image in spec.get("images", []):
        for obj in objects:
            _set_image(obj, image)
    return objects


def _load_objects(path: Path) -> list[Obj]:
    docs = [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d is not None]
    for doc in docs:
        if not isinstance(doc, dict) or "kind" not in doc or "apiVersion" not in doc:
            raise KustomizeError(f"{path}: every document must be an object with apiVersion/kind")
    return docs


# ---------------------------------------------------------------------------------------------
# patches


def _apply_patch(objects: list[Obj], entry: Obj, root: Path) -> None:
    if set(entry) - {"path", "patch", "target"}:
        raise KustomizeError(f"patch entry has unsupported keys: {sorted(entry)}")
    if ("path" in entry) == ("patch" in entry):
        raise KustomizeError("a patch entry needs exactly one of `path` or `patch`")
    text = (root / entry["path"]).read_text(encoding="utf-8") if "path" in entry else entry["patch"]
    body = yaml.safe_load(text)
    target = entry.get("target")
    if target is not None and set(target) - _TARGET_FIELDS:
        raise KustomizeError(f"patch target has unsupported keys: {sorted(target)}")

    if isinstance(body, list):
        if target is None:
            raise KustomizeError("a JSON6902 patch needs a `target`")
        for obj in _matching(objects, target, required=True):
            _json6902(obj, body)
        return
    if not isinstance(body, dict):
        raise KustomizeError("a patch must be a mapping (strategic merge) or a list (JSON6902)")
    _refuse_ambiguous_merge(body)
    if target is None:
        api_version = body.get("apiVersion", "")
        group, _, version = api_version.rpartition("/")
        target = {
            "group": group,
            "version": version,
            "kind": body.get("kind"),
            "name": body.get("metadata", {}).get("name"),
        }
    merge = {k: v for k, v in body.items() if k not in ("apiVersion", "kind")}
    for obj in _matching(objects, target, required=True):
        merged = _merge(obj, merge)
        obj.clear()
        obj.update(merged)


def _matching(objects: Iterable[Obj], target: Obj, *, required: bool) -> list[Obj]:
    found = []
    for obj in objects:
        group, _, version = obj.get("apiVersion", "").rpartition("/")
        actual = {
            "group": group,
            "version": version,
            "kind": obj.get("kind"),
            "name": obj.get("metadata", {}).get("name"),
        }
        if all(actual[k] == v for k, v in target.items() if v is not None):
            found.append(obj)
    if required and not found:
        raise KustomizeError(f"patch target {target} matches no object")
    return found


def _refuse_ambiguous_merge(node: Any, where: str = "") -> None:
    if isinstance(node, dict):
        for key, value in node.items():
            if isinstance(key, str) and key.startswith("$"):
                raise KustomizeError(f"strategic-merge directive {where}/{key} is not supported")
            _refuse_ambiguous_merge(value, f"{where}/{key}")
    elif isinstance(node, list) and any(isinstance(item, (dict, list)) for item in node):
        raise KustomizeError(
            f"strategic-merge patch sets a list of objects at {where}; use a JSON6902 patch"
        )


def _merge(base: Any, patch: Any) -> Any:
    """JSON merge patch (RFC 7386): what a map-only strategic-merge patch does."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(base) if isinstance(base, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = _merge(result.get(key), value)
    return result


def _json6902(obj: Obj, operations: list[Any]) -> None:
    for op in operations:
        if not isinstance(op, dict) or "op" not in op or "path" not in op:
            raise KustomizeError(f"not a JSON6902 operation: {op!r}")
        kind = op["op"]
        if kind not in ("add", "remove", "replace", "test"):
            raise KustomizeError(f"JSON6902 op {kind!r} is not supported")
        tokens = _pointer(op["path"])
        if not tokens:
            raise KustomizeError("JSON6902 ops on the whole document are not supported")
        parent = _walk(obj, tokens[:-1], op["path"])
        last = tokens[-1]
        if kind == "test":
            if _get(parent, last, op["path"]) != op.get("value"):
                raise KustomizeError(
                    f"JSON6902 test failed at {op['path']}: expected {op.get('value')!r}"
                )
        elif kind == "remove":
            _get(parent, last, op["path"])
            if isinstance(parent, list):
                del parent[_index(parent, last, op["path"])]
            else:
                del parent[last]
        elif kind == "replace":
            _get(parent, last, op["path"])
            value = copy.deepcopy(op["value"])
            if isinstance(parent, list):
                parent[_index(parent, last, op["path"])] = value
            else:
                parent[last] = value
        else:  # add
            value = copy.deepcopy(op["value"])
            if isinstance(parent, list):
                if last == "-":
                    parent.append(value)
                else:
                    position = int(last) if last.isdigit() else -1
                    if not 0 <= position <= len(parent):
                        raise KustomizeError(f"JSON6902 add: bad index in {op['path']}")
                    parent.insert(position, value)
            elif isinstance(parent, dict):
                parent[last] = value
            else:
                raise KustomizeError(f"JSON6902 add: {op['path']} is not inside a container")


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise KustomizeError(f"JSON pointer must start with '/': {path!r}")
    return [t.replace("~1", "/").replace("~0", "~") for t in path[1:].split("/")]


def _index(container: list[Any], token: str, path: str) -> int:
    if not token.isdigit() or int(token) >= len(container):
        raise KustomizeError(f"JSON pointer {path}: no element {token!r}")
    return int(token)


def _get(container: Any, token: str, path: str) -> Any:
    if isinstance(container, list):
        return container[_index(container, token, path)]
    if isinstance(container, dict) and token in container:
        return container[token]
    raise KustomizeError(f"JSON pointer {path}: no member {token!r}")


def _walk(node: Any, tokens: list[str], path: str) -> Any:
    for token in tokens:
        node = _get(node, token, path)
    return node


# ---------------------------------------------------------------------------------------------
# images


def _split_image(image: str) -> tuple[str, str | None, str | None]:
    """`registry/name:tag@digest` -> (name, tag, digest); a ':' in a registry port is not a tag."""
    digest = None
    if "@" in image:
        image, digest = image.split("@", 1)
    tag = None
    slash, colon = image.rfind("/"), image.rfind(":")
    if colon > slash:
        image, tag = image[:colon], image[colon + 1 :]
    return image, tag, digest


def _set_image(node: Any, rule: Obj) -> None:
    if set(rule) - {"name", "newName", "newTag", "digest"}:
        raise KustomizeError(f"images entry has unsupported keys: {sorted(rule)}")
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("containers", "initContainers") and isinstance(value, list):
                for container in value:
                    if isinstance(container, dict) and isinstance(container.get("image"), str):
                        container["image"] = _retag(container["image"], rule)
            _set_image(value, rule)
    elif isinstance(node, list):
        for item in node:
            _set_image(item, rule)


def _retag(image: str, rule: Obj) -> str:
    name, tag, digest = _split_image(image)
    if name != rule["name"]:
        return image
    name = rule.get("newName", name)
    # As kustomize's image transformer: a new tag or digest replaces both old ones, and both
    # given make `name:tag@digest` (the runtime pulls by the digest; the tag is for people).
    if "newTag" in rule and "digest" in rule:
        return f"{name}:{rule['newTag']}@{rule['digest']}"
    if "digest" in rule:
        return f"{name}@{rule['digest']}"
    if "newTag" in rule:
        return f"{name}:{rule['newTag']}"
    return name + (f":{tag}" if tag else "") + (f"@{digest}" if digest else "")


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python k8s/render_kustomize.py <kustomization directory>", file=sys.stderr)
        return 2
    yaml.safe_dump_all(render(args[0]), sys.stdout, sort_keys=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
