"""Inputs with known properties: exact-length prompts from real text and tasks with known answers.

``prompts`` (prompts of an exact token length from shipped text, chat templating, the speed techniques' task
prompts), ``haystack`` (needle and
key-value retrieval tasks over real documentation text), ``reasoning`` (seeded multi-step tasks, answer
extraction, scoring under a thinking budget). May use techniques (a reasoning task runs under budget forcing) and
instruments; never run machinery or experiments.
"""

#: the folder's face: the modules code outside it (other folders, notebooks, benchmarks) may import
__all__ = ["haystack", "prompts", "reasoning"]
