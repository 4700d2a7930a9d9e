/* `caccel merge-weights DIR OUT`: a sharded checkpoint (fsdp_state_dict_type SHARDED_STATE_DICT) into
 * one OUT/model.safetensors, as `accelerate merge-weights` does. */
#include "tools/cli_impl.h"

#include <stdio.h>
#include <string.h>

int ca_cmd_merge_weights(int argc, char **argv) {
    if (argc == 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
        printf("usage: caccel merge-weights CHECKPOINT_DIR OUTPUT_DIR\n"
               "Merges the shards of a checkpoint saved with fsdp_state_dict_type SHARDED_STATE_DICT\n"
               "(zero_index.json, zero_shard_<rank>.safetensors) into OUTPUT_DIR/model.safetensors.\n");
        return 0;
    }
    if (argc != 3) {
        fprintf(stderr, "caccel merge-weights: usage: caccel merge-weights CHECKPOINT_DIR OUTPUT_DIR\n");
        return 2;
    }
    if (ca_merge_weights(argv[1], argv[2]) != CA_OK) return ca_cli_fail("merge-weights");
    printf("caccel merge-weights: wrote %s/model.safetensors\n", argv[2]);
    return 0;
}
