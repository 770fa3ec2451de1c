"""The parent↔child contract: what an engine child is asked to do, and what it hands back.

The parent writes a Job as JSON and starts `python -m repro.engine JOB.json`; the child writes one
ArmResult to the job's output path and exits (EXIT_OK, or EXIT_RAISED with `error` set). Both
sides use these frozen dataclasses and their to_json/from_json. Reading is strict: a wrong kind,
a newer or older schema_version or a malformed field is a ContractError with one line, which the
runner turns into a named failure, never a KeyError. When the parent cannot get a result, the arm
carries a Failure of one of FAILURE_KINDS.

  repro.contract.job      the job: the arm, its engine, its probes or scenario, the preflight
  repro.contract.result   the result: every probe's requests, or the error the child raised
  repro.contract.failure  the failure kinds, ContractError and the strict field readers that raise it,
                          and the Failure an arm carries when there is no usable result
  repro.contract.served   the texts a server's tokenizer is checked on (repro endpoint and each served child)
"""
