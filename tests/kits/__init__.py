"""What tests share: the harness and reference server in one trio run
(:mod:`tests.kits.harness`), the harness as a subprocess (:mod:`tests.kits.process`),
faulty ledgers (:mod:`tests.kits.ledger`), small ASGI apps (:mod:`tests.kits.asgi`),
held git checkouts (:mod:`tests.kits.gitgate`) and the other helpers more than one
test module uses. Test modules import kits, never each other; kits may import kits.
"""
