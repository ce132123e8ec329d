"""gRPC engine worker: `specroute worker --engine {ar,mtp,dflash,dfly,vllm,null} --model DIR --port N`."""
