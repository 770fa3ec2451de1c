"""The KV audit's recorder: a KV connector that reads the paged KV blocks a request reused or computed.

Two classes, both resolved by vLLM's connector factory from this module
(`kv_connector_module_path="repro.engine.kvaudit"`):

  KVAuditObserver   a connector that never loads or stores anything: on the baseline arm it records
                    the KV the cache-off prefill computed (the reference); on the native arm it
                    records the blocks native prefix caching reused, and the cold prefill's KV.
  KVAuditWrapped    made at run time as a subclass of any other connector class (in-tree by name,
                    LMCache's, or one loaded from a module path) named in the environment
                    (AUDIT_TARGET_ENV): every hook forwards to the wrapped connector first, then the
                    audit reads the blocks. It needs no cooperation from the connector.

The audit's hooks, what they read and when, and the files they write are repro.engine.kvaudit_hooks
(AuditHooks, mixed in before the connector class each of these audits); how K and V sit in a block,
repro.engine.kv_blocks; what the worker records about itself, repro.engine.worker_facts.
"""

from __future__ import annotations

import os
from types import SimpleNamespace
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)

from repro.engine.kvaudit_hooks import HOOKS_BEFORE_030, HOOKS_SINCE_030, AuditHooks, AuditMetadata

AUDIT_TARGET_ENV = "KVKIT_KV_AUDIT_TARGET"  # "Name" (vLLM's registry) or "module.path:Name"
MODULE = "repro.engine.kvaudit"
OBSERVER = "KVAuditObserver"
# The observer's kv_role. Not "kv_both": vLLM reads a connector's role as what it does. A consumer
# (kv_consumer, kv_both) under async scheduling makes vLLM 0.28's scheduler defer freeing a finished
# or preempted request's blocks by a step (Scheduler.defer_block_free), and a producer's
# requires_kv_delivery drops a preempted request's in-flight output (the observer says False below).
# The observer loads and stores nothing, so as a producer that needs no delivery the scheduler of a
# full-attention model runs as with no connector: the audited control is the unaudited control.
# Partial-tail offloads, the producer role's other effect, are for Mamba groups only.
OBSERVER_ROLE = "kv_producer"
WRAPPED = "KVAuditWrapped"


class KVAuditObserver(AuditHooks, KVConnectorBase_V1):
    """Loads nothing, stores nothing: records reused and computed blocks only."""

    def __init__(self, vllm_config, role: KVConnectorRole, kv_cache_config=None):
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        self._audit_init(vllm_config, role)

    @property
    def requires_kv_delivery(self) -> bool:  # it hands nothing off (see OBSERVER_ROLE)
        return False

    def get_num_new_matched_tokens(self, request, num_computed_tokens: int):
        self._audit_matched(request, num_computed_tokens, (0, False))
        return 0, False

    def update_state_after_alloc(self, request, blocks, num_external_tokens: int) -> None:
        return

    def build_connector_meta(self, scheduler_output) -> KVConnectorMetadata:
        return self._audit_meta(scheduler_output, None)

    def register_kv_caches(self, kv_caches) -> None:
        self._audit_register(kv_caches)

    def bind_connector_metadata(self, connector_metadata) -> None:
        super().bind_connector_metadata(connector_metadata)
        self._audit_bind(connector_metadata)

    def handle_preemptions(self, kv_connector_metadata) -> None:
        return

    def start_load_kv(self, forward_context, **kwargs: Any) -> None:
        return

    def wait_for_layer_load(self, layer_name: str) -> None:
        self._audit_write(layer_name, "reused")

    def save_kv_layer(self, layer_name: str, kv_layer, attn_metadata, **kwargs: Any) -> None:
        return

    def wait_for_save(self) -> None:
        self._audit_write_computed()


def _target_class(spec: str):
    """The connector class an audit wraps: 'module.path:Name' or a name in vLLM's registry."""
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory

    module, _, name = spec.rpartition(":")
    cfg = SimpleNamespace(kv_connector=name, kv_connector_module_path=module or None)
    return KVConnectorFactory.get_connector_class(cfg)


def make_wrapped(target) -> type:
    """A subclass of `target` whose hooks call the target's first, then the audit's. A load's completion is read
    where the installed vLLM's worker asks for it: get_transfer_results where the class has it (vLLM 0.30 on; the
    base class's calls get_finished, MultiConnector's and NixlConnector's do not), get_finished always."""
    transfer_results = hasattr(target, "get_transfer_results")

    class Wrapped(AuditHooks, target):
        _audit_target_name = f"{target.__module__}.{target.__qualname__}"
        _audit_completion_hooks = HOOKS_SINCE_030 if transfer_results else HOOKS_BEFORE_030

        def __init__(self, vllm_config, role, kv_cache_config=None):
            target.__init__(self, vllm_config, role, kv_cache_config)
            self._audit_init(vllm_config, role)

        def get_num_new_matched_tokens(self, request, num_computed_tokens: int):
            result = target.get_num_new_matched_tokens(self, request, num_computed_tokens)
            self._audit_matched(request, num_computed_tokens, result)
            return result

        def update_state_after_alloc(self, request, blocks, num_external_tokens: int):
            out = target.update_state_after_alloc(self, request, blocks, num_external_tokens)
            self._audit_alloc(request, num_external_tokens)
            return out

        def build_connector_meta(self, scheduler_output):
            return self._audit_meta(scheduler_output, target.build_connector_meta(self, scheduler_output))

        def register_kv_caches(self, kv_caches):
            out = target.register_kv_caches(self, kv_caches)
            self._audit_register(kv_caches)
            return out

        def bind_connector_metadata(self, connector_metadata):
            return target.bind_connector_metadata(self, self._audit_bind(connector_metadata))

        def handle_preemptions(self, kv_connector_metadata):
            inner = kv_connector_metadata.inner if isinstance(kv_connector_metadata, AuditMetadata) else None
            return target.handle_preemptions(self, inner if inner is not None else kv_connector_metadata)

        def get_finished(self, finished_req_ids):
            return self._audit_get_finished(target.get_finished, finished_req_ids)

        if hasattr(target, "get_block_ids_with_load_errors"):  # the blocks it reports not loaded (vLLM 0.26 on)

            def get_block_ids_with_load_errors(self):
                out = target.get_block_ids_with_load_errors(self)
                self._audit_load_errors(out)
                return out

        if transfer_results:  # only where vLLM has it: the wrapped class offers what the target offers

            def get_transfer_results(self, finished_req_ids):
                return self._audit_get_transfer_results(target.get_transfer_results, finished_req_ids)

        def wait_for_layer_load(self, layer_name: str):
            out = target.wait_for_layer_load(self, layer_name)
            self._audit_write(layer_name, "reused")
            return out

        def wait_for_save(self):
            out = target.wait_for_save(self)
            self._audit_write_computed()
            return out

    Wrapped.__name__ = Wrapped.__qualname__ = WRAPPED
    Wrapped.__module__ = MODULE
    return Wrapped


_WRAPPED_CACHE: dict[str, type] = {}


def __getattr__(name: str):
    """PEP 562: vLLM's factory asks this module for WRAPPED; build it for the named target."""
    if name != WRAPPED:
        raise AttributeError(name)
    spec = os.environ.get(AUDIT_TARGET_ENV)
    if not spec:
        raise AttributeError(f"{WRAPPED} needs {AUDIT_TARGET_ENV}=Name or module.path:Name")
    if spec not in _WRAPPED_CACHE:
        _WRAPPED_CACHE[spec] = make_wrapped(_target_class(spec))
    return _WRAPPED_CACHE[spec]
