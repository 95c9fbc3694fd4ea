/* rope_mode.c: -m rope, the RoPE settings made visible. For each rotated
 * pair it prints the inverse frequency run.c's rope_frequencies gives for the
 * settings (the checkpoint's, with the command line's overrides), its
 * wavelength, its ratio to the unscaled frequency and whether the pair is
 * extrapolated or interpolated; tests compare these with Hugging Face's and
 * llama.cpp's formulas.
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "modes.h"

/* -m rope: the inverse frequencies used for the full context, per pair i:
 * inv_freq, its wavelength 2*pi/inv_freq in tokens, its ratio to the unscaled
 * frequency, and whether the pair is extrapolated (frequency kept as trained:
 * positions past the training length simply turn it further) or interpolated
 * (frequency lowered, so the longer context maps into angles seen in
 * training). The first line is the run's position setup (info.c), with the
 * attention factor of the methods that have one. Dynamic NTK is shown for
 * length ctx. */
void rope_mode(const ModeInput *in) {
    const Transformer *t = in->t;
    const RopeConfig *r = &t->rope;
    int json = in->o->json;
    fputs(in->summary, stderr);
    int n_pairs = r->rot_dim / 2;
    double *inv = malloc((size_t)n_pairs * sizeof(double)), *plain = malloc((size_t)n_pairs * sizeof(double));
    double mscale, unused;
    if (!inv || !plain) die(EXIT_BAD_INPUT, "out of memory");
    rope_frequencies(r, t->n_ctx, inv, &mscale);
    RopeConfig unscaled = *r;
    unscaled.scaling = ROPE_NONE;
    rope_frequencies(&unscaled, t->n_ctx, plain, &unused);
    // LongRoPE: which of its two factor arrays a sequence of --ctx tokens uses
    const char *factors = r->scaling != ROPE_LONGROPE ? NULL : t->n_ctx > r->orig_ctx ? "long" : "short";
    if (json) {
        printf("{\"rot_dim\": %d, \"layout\": \"%s\", \"base\": %.17g, \"scaling\": \"%s\", \"factor\": %.17g, "
               "\"orig_ctx\": %d, \"ctx\": %d, \"attn_factor\": %.17g, ",
               r->rot_dim, LAYOUT_NAMES[r->layout], r->base, SCALING_NAMES[r->scaling], r->factor, r->orig_ctx,
               t->n_ctx, mscale);
        if (factors) printf("\"longrope_factors\": \"%s\", ", factors);
        printf("\"position\": ");
        print_position_json(t);
        printf(", \"inv_freq\": [");
        for (int i = 0; i < n_pairs; i++) printf("%s%.17g", i ? ", " : "", inv[i]);
        printf("], \"wavelength\": [");
        for (int i = 0; i < n_pairs; i++) printf("%s%.17g", i ? ", " : "", 2 * PI / inv[i]);
        printf("], \"ratio\": [");
        for (int i = 0; i < n_pairs; i++) printf("%s%.17g", i ? ", " : "", inv[i] / plain[i]);
        printf("], \"status\": [");
        for (int i = 0; i < n_pairs; i++)
            printf("%s\"%s\"", i ? ", " : "", fabs(inv[i] / plain[i] - 1) < 1e-12 ? "extrapolated" : "interpolated");
        printf("]}\n");
    } else {
        char setup[512];
        position_setup_text(setup, sizeof setup, t);
        printf("position: %s\n", setup); // with the attn_factor of the methods that have one
        if (factors)
            printf("longrope: the %s factors (a sequence of %d tokens is %s than orig_ctx %d)\n", factors, t->n_ctx,
                   t->n_ctx > r->orig_ctx ? "longer" : "no longer", r->orig_ctx);
        printf("%5s %16s %16s %12s  %s\n", "pair", "inv_freq", "wavelength", "/ unscaled", "status");
        for (int i = 0; i < n_pairs; i++) {
            double ratio = inv[i] / plain[i];
            printf("%5d %16.10g %16.6g %12.6g  %s\n", i, inv[i], 2 * PI / inv[i], ratio,
                   fabs(ratio - 1) < 1e-12 ? "extrapolated" : "interpolated");
        }
    }
    free(inv);
    free(plain);
}
