"""attngen inside other libraries' models.

`attngen.integrations.transformers`: Hugging Face transformers models run their attention through
attngen (`attn_implementation="attngen"`; needs the `attngen[hf]` extra). Importing it registers
the implementation.
"""
