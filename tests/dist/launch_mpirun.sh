#!/bin/sh
# caccel launch hands a job to mpirun where Accelerate's launcher would: an mpirun_hostfile in the
# config file (or --mpirun_hostfile) runs mpirun with the hostfile and the processes per machine
# (Open MPI: --hostfile F --map-by ppr:N:node; MPICH/Intel MPI: -f F -ppn N), never local Gloo ranks
# that wait for remote ones; a hostfile with another backend is refused. Launcher flags reach the
# ranks as variables (--even_batches as CACCEL_EVEN_BATCHES). Fake launchers print their arguments.
. "$(dirname "$0")/lib.sh"
need_caccel

fake() {   # fake NAME VERSION-LINE: a launcher that prints its arguments
    printf '#!/bin/sh\n[ "$1" = "--version" ] && { echo "%s"; exit 0; }\necho "ARGS: $*"\n' "$2" > "$WORK/$1"
    chmod +x "$WORK/$1"
}
fake ompi "mpirun (Open MPI) 4.1.4"
fake hydra "HYDRA build details:"
printf 'host1 slots=2\nhost2 slots=2\n' > "$WORK/hosts"
cat > "$WORK/cfg.yaml" <<YAML
distributed_type: MULTI_CPU
num_machines: 2
num_processes: 4
main_process_ip: host1
mpirun_config:
  mpirun_hostfile: $WORK/hosts
YAML

note "mpirun_hostfile in the config file, Open MPI: --hostfile with --map-by ppr:2:node"
MPIRUN="$WORK/ompi" timeout 30 "$CACCEL" launch -q --config_file "$WORK/cfg.yaml" /bin/true >"$WORK/out" 2>&1 ||
    { cat "$WORK/out"; fail "the launcher did not hand the job to mpirun"; }
count 1 "^ARGS: -np 4 --hostfile $WORK/hosts --map-by ppr:2:node -x ACCELERATE_CONFIG_FILE -x CACCEL_BACKEND /bin/true\$" "$WORK/out"

note "--mpirun_hostfile on the command line, MPICH/Intel MPI: -f with -ppn, one machine"
MPIRUN="$WORK/hydra" timeout 30 "$CACCEL" launch -q --num_processes 3 --mpirun_hostfile "$WORK/hosts" /bin/true \
    >"$WORK/out" 2>&1 || { cat "$WORK/out"; fail "the launcher did not hand the job to mpirun"; }
count 1 "^ARGS: -np 3 -f $WORK/hosts -ppn 3 -genvlist CACCEL_BACKEND /bin/true\$" "$WORK/out"

note "a hostfile with backend gloo is refused, naming both settings"
MPIRUN="$WORK/ompi" timeout 30 "$CACCEL" launch -q --config_file "$WORK/cfg.yaml" --backend gloo /bin/true \
    >"$WORK/out" 2>&1 && { cat "$WORK/out"; fail "the launcher accepted a hostfile with backend gloo"; }
count 1 "mpirun_hostfile ($WORK/cfg.yaml:6) starts the processes through mpirun, which needs backend mpi, but backend is gloo (--backend)" "$WORK/out"

note "--even_batches false reaches the ranks as CACCEL_EVEN_BATCHES"
timeout 60 "$CACCEL" launch -q --main_process_port 0 --num_processes 2 --even_batches false \
    sh -c 'echo "rank $RANK: even_batches=$CACCEL_EVEN_BATCHES"' >"$WORK/out" 2>&1 ||
    { cat "$WORK/out"; fail "launching sh failed"; }
count 2 "^rank [01]: even_batches=false\$" "$WORK/out"
no_orphans
echo "PASS"
