# tensor/: the tensor engine: tensors and scopes, the autograd tape, the autocast policy and every
# differentiable op (each through the device's kernel table).
libcaccel_la_SOURCES += \
	tensor/tensor_impl.h \
	tensor/tensor.c \
	tensor/meta.c \
	tensor/autograd.c \
	tensor/checkpoint.c \
	tensor/autocast.c \
	tensor/ops_impl.h \
	tensor/ops_common.c \
	tensor/ops_elementwise.c \
	tensor/ops_shape.c \
	tensor/ops_reduce.c \
	tensor/ops_linalg.c \
	tensor/ops_nn.c \
	tensor/ops_attention.c \
	tensor/ops_index.c \
	tensor/safetensors_impl.h \
	tensor/safetensors.c \
	tensor/st_parts.c
