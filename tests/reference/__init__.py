"""The independent references the tests check run against, written from the
formulas and sharing no code with run.c or export.py (tests/README.md lists
which test uses which):

    reference.forward  the float64 numpy forward pass of a checkpoint in run's
                       layout (Reference), and `run -m ppl`'s windowing on top
                       of it (ppl_reference)
    reference.hf       the float64 numpy forward pass of a Hugging Face
                       Llama-family model in Hugging Face's semantics
                       (HFReference), and transformers' RoPE frequencies for
                       each rope type (inv_freq_and_attention)

The tests import them as `from reference.forward import ...`: pytest puts
tests/ on sys.path for the test files there.
"""
