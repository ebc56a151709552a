"""Fine-tuning for AsyncLM (§4): training samples simulated on function-call DAGs, and LoRA training.

* ``oven asynclm-data`` (data.py): tasks from the demo tools (demo_tasks.py) and BFCL
  (bfcl_tasks.py), split by BFCL id and demo entity (split.py), simulated with the LPT strategy
  (simulate.py; plain.py for the variant without CML), written token-exact as the inferlet
  builds its context (segments.py, with the inferlet's own prompt and CML modules: protocol.py).
* ``oven asynclm-train`` (train.py): PEFT LoRA on the served model (model.py), batches that share
  a prompt prefix (batches.py), resumable, writing a PEFT adapter folder.
* check.py: the AsyncLM loop in process (transformers + PEFT, greedy) on held-out demo tasks.
"""
