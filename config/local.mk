# config/: Accelerate's configuration: the keys, the file, the ACCELERATE_* variables and the
# launcher flags, one precedence rule and the origin of every value (docs/CONFIGURATION.md).
libcaccel_la_SOURCES += \
	config/config_impl.h \
	config/config.c \
	config/config_keys.c \
	config/config_file.c \
	config/config_effects.c
