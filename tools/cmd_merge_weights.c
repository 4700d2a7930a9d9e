/* `caccel merge-weights DIR OUT`: a sharded checkpoint (fsdp_state_dict_type SHARDED_STATE_DICT) into
 * one OUT/model.safetensors, as `accelerate merge-weights` does.
 * `caccel merge-weights --adapter ADAPTER BASE OUT`: a PEFT LoRA adapter merged into a base model's
 * model.safetensors, as PEFT's merge_and_unload + save_pretrained. */
#include "tools/cli_impl.h"

#include <stdio.h>
#include <string.h>

#define USAGE "usage: caccel merge-weights CHECKPOINT_DIR OUTPUT_DIR\n" \
              "       caccel merge-weights --adapter ADAPTER_DIR BASE_DIR OUTPUT_DIR\n"

int ca_cmd_merge_weights(int argc, char **argv) {
    if (argc == 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
        printf(USAGE
               "Merges the shards of a checkpoint saved with fsdp_state_dict_type SHARDED_STATE_DICT\n"
               "(zero_index.json, zero_shard_<rank>.safetensors) into OUTPUT_DIR/model.safetensors.\n"
               "With --adapter, adds a LoRA adapter saved by PEFT or caccel (adapter_config.json,\n"
               "adapter_model.safetensors) to the weights of BASE_DIR/model.safetensors and writes the\n"
               "merged model to OUTPUT_DIR/model.safetensors, with a copy of BASE_DIR/config.json.\n");
        return 0;
    }
    bool adapter = argc == 5 && !strcmp(argv[1], "--adapter");
    if (argc != 3 && !adapter) {
        fprintf(stderr, "caccel merge-weights: " USAGE);
        return 2;
    }
    if (adapter) {
        if (ca_lora_merge_files(argv[2], argv[3], argv[4]) != CA_OK) return ca_cli_fail("merge-weights --adapter");
        printf("caccel merge-weights: wrote %s/model.safetensors\n", argv[4]);
        return 0;
    }
    if (ca_merge_weights(argv[1], argv[2]) != CA_OK) return ca_cli_fail("merge-weights");
    printf("caccel merge-weights: wrote %s/model.safetensors\n", argv[2]);
    return 0;
}
