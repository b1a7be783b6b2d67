"""`lemur-convert`: Hugging Face Llama/Qwen2/Mistral checkpoints to lemur checkpoints and back,
and a lemur-train run's checkpoint to a lemur checkpoint (`cli`).

A command, so it sits in the commands layer above train and eval (it reads a run's checkpoint
with `lemur.eval.load`); the conversions themselves are lemur.model's (hf, checkpoint,
export_dir, hf_tokenizer, pretrained), which import nothing above model.
"""
