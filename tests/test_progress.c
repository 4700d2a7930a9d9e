/* The progress bar (caccel/progress.h) against a clock the test moves: the line format off a
 * terminal, the 10% and interval rules, redraws rate-limited by the clock on a terminal, ETA and
 * rate arithmetic, the loss from ca_log_metrics, and the ways it is silenced. With arguments it is
 * the C side of tests/test_progress_ranks.sh (under caccel launch):
 *   test_progress --ranks    every rank runs a 10-step bar on stderr described as "rank <r>" */
#include "test_util.h"

#include <caccel/progress.h>

static double g_now;

static double fake_clock(void *ctx) {
    (void)ctx;
    return g_now;
}

static ca_accelerator *make_acc(const char *setting) {
    const char *settings[] = {"use_cpu=true", setting, NULL};
    char *argv[] = {"test_progress", NULL};
    ca_accelerator *acc = NULL;
    T_OK(ca_accelerator_create(&(ca_options){.argc = 1, .argv = argv, .settings = settings}, &acc));
    return acc;
}

typedef struct sink {
    char *text;
    size_t len;
    FILE *f;
} sink;

static void sink_open(sink *s) {
    *s = (sink){0};
    s->f = open_memstream(&s->text, &s->len);
    assert_non_null(s->f);
}

static void sink_close(sink *s) {
    fclose(s->f);
    free(s->text);
}

static int count_char(const char *s, char c) {
    int n = 0;
    for (; s && *s; s++) n += *s == c;
    return n;
}

/* interval: min_interval on a terminal, log_interval off it */
static ca_progress *bar_at_zero(ca_accelerator *acc, sink *s, int64_t total, int tty, double interval) {
    g_now = 0;
    ca_progress *p = NULL;
    T_OK(ca_progress_create(acc, &(ca_progress_opts){.total = total, .desc = "epoch 1/2", .out = s->f, .tty = tty,
                                                       .min_interval = interval, .log_interval = interval, .clock = fake_clock},
                            &p));
    return p;
}

/* Off a terminal: a line at each 10%, none at close when the last one showed the final count. */
static void test_line_format(void **state) {
    (void)state;
    ca_accelerator *acc = make_acc(NULL);
    sink s;
    sink_open(&s);
    ca_progress *p = bar_at_zero(acc, &s, 100, 0, 0);   /* tty 0: the stream decides (a memory stream is none) */
    for (int i = 0; i < 100; i++) {
        g_now += 0.25;
        if (i == 50) T_OK(ca_log_metrics(acc, (ca_metric[]){{"accuracy", 0.5}, {"train_loss", 0.25}}, 2, i));
        T_OK(ca_progress_update(p, 1));
    }
    assert_int_equal(ca_progress_count(p), 100);
    T_OK(ca_progress_close(p));
    fflush(s.f);
    assert_int_equal(count_char(s.text, '\n'), 10);
    assert_int_equal(count_char(s.text, '\r'), 0);
    const char *first = "epoch 1/2:  10% 10/100 [00:02<00:22, 4.00 it/s]\n";
    assert_memory_equal(s.text, first, strlen(first));
    assert_non_null(strstr(s.text, "epoch 1/2:  50% 50/100 [00:12<00:12, 4.00 it/s]\n"));
    assert_non_null(strstr(s.text, "epoch 1/2:  60% 60/100 [00:15<00:10, 4.00 it/s, loss=0.25]\n"));
    assert_non_null(strstr(s.text, "epoch 1/2: 100% 100/100 [00:25<00:00, 4.00 it/s, loss=0.25]\n"));
    sink_close(&s);
    ca_accelerator_destroy(acc);
}

/* Off a terminal and without a total: a line every log_interval seconds, and the final one. */
static void test_line_interval(void **state) {
    (void)state;
    ca_accelerator *acc = make_acc(NULL);
    sink s;
    sink_open(&s);
    ca_progress *p = bar_at_zero(acc, &s, 0, -1, 30);
    for (int i = 0; i < 1000; i++) T_OK(ca_progress_update(p, 1));   /* the clock stands still */
    fflush(s.f);
    assert_int_equal(s.len, 0);
    g_now = 31;
    T_OK(ca_progress_update(p, 1));
    T_OK(ca_progress_set_loss(p, 1.5));
    g_now = 40;
    T_OK(ca_progress_update(p, 1));   /* within 30 s of the last line */
    T_OK(ca_progress_close(p));
    fflush(s.f);
    assert_string_equal(s.text, "epoch 1/2: 1001 [00:31, 32.29 it/s]\n"
                                "epoch 1/2: 1002 [00:40, 25.05 it/s, loss=1.5]\n");
    sink_close(&s);
    ca_accelerator_destroy(acc);
}

/* On a terminal the clock alone limits redraws: a frozen clock draws at start and close only,
 * whatever the number of steps; a moving one at most once per min_interval. */
static void test_terminal_rate_limit(void **state) {
    (void)state;
    ca_accelerator *acc = make_acc(NULL);
    sink s;
    sink_open(&s);
    ca_progress *p = bar_at_zero(acc, &s, 100000, 1, 0);   /* 0: the default 0.1 s */
    for (int i = 0; i < 100000; i++) T_OK(ca_progress_update(p, 1));
    T_OK(ca_progress_close(p));
    fflush(s.f);
    assert_int_equal(count_char(s.text, '\r'), 2);
    assert_int_equal(count_char(s.text, '\n'), 1);
    assert_non_null(strstr(s.text, "\repoch 1/2:   0%|          | 0/100000 [00:00<?, ? it/s]"));
    assert_non_null(strstr(s.text, "\repoch 1/2: 100%|##########| 100000/100000 [00:00<?, ? it/s]\n"));
    sink_close(&s);

    sink_open(&s);
    p = bar_at_zero(acc, &s, 1024, 1, 0.125);
    for (int i = 0; i < 1024; i++) {   /* 1/1024 s per step for 1 s, a redraw every 1/8 s: 8 */
        g_now += 1.0 / 1024;
        T_OK(ca_progress_update(p, 1));
    }
    T_OK(ca_progress_close(p));
    fflush(s.f);
    assert_int_equal(count_char(s.text, '\r'), 10);   /* start, 8 redraws, close */
    assert_non_null(strstr(s.text, "\repoch 1/2:  50%|#####     | 512/1024 [00:00<00:00, 1024.00 it/s]\r"));
    sink_close(&s);
    ca_accelerator_destroy(acc);
}

/* ETA = (total - n) / mean rate; h:mm:ss from an hour; "s/it" below 1 it/s. */
static void test_eta_arithmetic(void **state) {
    (void)state;
    ca_accelerator *acc = make_acc(NULL);
    sink s;
    sink_open(&s);
    ca_progress *p = bar_at_zero(acc, &s, 10000, -1, 1);
    g_now = 1;
    T_OK(ca_progress_update(p, 1));   /* 1 it/s, 9999 s left */
    g_now = 8;
    T_OK(ca_progress_update(p, 3));   /* 4 steps in 8 s: 2 s/it, 19992 s left */
    T_OK(ca_progress_close(p));
    g_now = 0;   /* resumed at 9000 of 10000: the rate counts the new steps only */
    T_OK(ca_progress_create(acc, &(ca_progress_opts){.total = 10000, .initial = 9000, .out = s.f, .tty = -1,
                                                       .log_interval = 1, .clock = fake_clock}, &p));
    g_now = 10;
    T_OK(ca_progress_update(p, 50));   /* 5 it/s, 950 steps: 190 s left */
    T_OK(ca_progress_close(p));
    fflush(s.f);
    assert_string_equal(s.text, "epoch 1/2:   0% 1/10000 [00:01<2:46:39, 1.00 it/s]\n"
                                "epoch 1/2:   0% 4/10000 [00:08<5:33:12, 2.00 s/it]\n"
                                " 90% 9050/10000 [00:10<03:10, 5.00 it/s]\n");
    sink_close(&s);
    ca_accelerator_destroy(acc);
}

/* progress=false, a log level above WARNING and opts.disable write nothing; counting goes on. */
static void test_silenced(void **state) {
    (void)state;
    const char *settings[] = {"progress=false", NULL, NULL};
    for (int k = 0; k < 3; k++) {
        ca_accelerator *acc = make_acc(settings[k]);
        if (k == 1) ca_log_set_level(CA_LOG_ERROR);
        sink s;
        sink_open(&s);
        g_now = 0;
        ca_progress *p = NULL;
        T_OK(ca_progress_create(acc, &(ca_progress_opts){.total = 10, .out = s.f, .tty = 1, .clock = fake_clock,
                                                           .disable = k == 2}, &p));
        for (int i = 0; i < 10; i++) {
            g_now += 100;
            T_OK(ca_progress_update(p, 1));
        }
        assert_int_equal(ca_progress_count(p), 10);
        T_OK(ca_progress_close(p));
        fflush(s.f);
        assert_int_equal(s.len, 0);
        sink_close(&s);
        ca_log_set_level(CA_LOG_WARNING);
        ca_accelerator_destroy(acc);
    }
}

static void test_errors(void **state) {
    (void)state;
    ca_accelerator *acc = make_acc(NULL);
    ca_progress *p = NULL;
    assert_int_equal(ca_progress_create(NULL, NULL, &p), CA_ERR_INVALID);
    assert_int_equal(ca_progress_create(acc, NULL, NULL), CA_ERR_INVALID);
    assert_int_equal(ca_progress_update(NULL, 1), CA_ERR_INVALID);
    T_OK(ca_progress_create(acc, &(ca_progress_opts){.disable = true}, &p));
    assert_int_equal(ca_progress_update(p, -1), CA_ERR_INVALID);
    assert_int_equal(ca_progress_set_loss(NULL, 1), CA_ERR_INVALID);
    T_OK(ca_progress_close(NULL));
    ca_accelerator_destroy(acc);   /* before the bar: the bar is detached, closing it stays safe */
    T_OK(ca_progress_close(p));
}

/* Every rank draws a bar of 10 steps on stderr, line mode; only the main process's may appear. */
static int ranks(void) {
    char *argv[] = {"test_progress", NULL};
    ca_accelerator *acc;
    CA_CHECK(ca_accelerator_create(&(ca_options){.argc = 1, .argv = argv}, &acc));
    char desc[32];
    snprintf(desc, sizeof desc, "rank %d", ca_process_index(acc));
    ca_progress *p;
    CA_CHECK(ca_progress_create(acc, &(ca_progress_opts){.total = 10, .desc = desc, .tty = -1}, &p));
    for (int i = 0; i < 10; i++) {
        CA_CHECK(ca_log_metrics(acc, (ca_metric[]){{"loss", 1.0 / (i + 1)}}, 1, i));
        CA_CHECK(ca_progress_update(p, 1));
    }
    CA_CHECK(ca_progress_close(p));
    printf("rank %d: counted %d\n", ca_process_index(acc), 10);
    CA_CHECK(ca_wait_for_everyone(acc));
    ca_accelerator_destroy(acc);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 2 && !strcmp(argv[1], "--ranks")) return ranks();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_line_format),
        cmocka_unit_test(test_line_interval),
        cmocka_unit_test(test_terminal_rate_limit),
        cmocka_unit_test(test_eta_arithmetic),
        cmocka_unit_test(test_silenced),
        cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
