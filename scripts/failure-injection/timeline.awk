# results.tsv -> one SVG page: a panel per run (a row per algorithm, a column per policy) with,
# over the run's seconds, the decisions serve admitted per second and its fallbacks per second
# (from metrics.tsv, sampled every 100 ms, each over the last second), the limit's rate (dashed), the outage
# (red: the primary dead; pink: restarted, not serving yet), and below, the worst per-second p99
# of the three bench processes on a log scale (0.1 ms to 2 s).
# Run with -F'\t' -v out=DIR -v duration=S -v rate=R -v limit=L.
function x(t) { return px + t / duration * pw }
function y(v) { v = v > rate ? rate : v; return py + ph - v / rate * ph }
function ly(us) { us = us < 100 ? 100 : us > 2000000 ? 2000000 : us; return ly0 + lh - (log(us / 100) / log(20000)) * lh }
function esc(s) { gsub(/&/, "\\&amp;", s); gsub(/</, "\\&lt;", s); return s }
function field(file, name,    line, parts) {
  while ((getline line < file) > 0) { split(line, parts, " "); if (parts[1] == name) { close(file); return parts[2] } }
  close(file); return ""
}
NR == 1 { next }
{ runs++; policy[runs] = $1; algorithm[runs] = $2; over[runs] = $13 + $14
  if (!($1 in col)) col[$1] = ncol++
  if (!($2 in row)) row[$2] = nrow++ }
END {
  W = 360; H = 200; M = 10
  printf "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" font-family=\"sans-serif\" font-size=\"10\">\n", ncol * W + 2 * M, nrow * H + 50
  printf "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n"
  printf "<text x=\"%d\" y=\"16\" font-size=\"12\">One Redis Cluster primary of three killed (SIGKILL), then restarted, under %d requests/s</text>\n", M, rate
  printf "<text x=\"%d\" y=\"30\">admitted/s (green), fallbacks/s (orange), the limit (dashed), worst per-second p99 (blue, log scale); red: the primary dead, pink: restarted, not serving yet</text>\n", M
  for (r = 1; r <= runs; r++) {
    dir = out "/" policy[r] "-" algorithm[r]
    ox = M + col[policy[r]] * W; oy = 40 + row[algorithm[r]] * H
    px = ox + 35; pw = W - 50; py = oy + 14; ph = 110; ly0 = py + ph + 8; lh = 40
    t0 = field(dir "/events.txt", "t0_ns"); tk = (field(dir "/events.txt", "kill_ns") - t0) / 1e9
    tp = (field(dir "/events.txt", "ping_ns") - t0) / 1e9; tr = field(dir "/events.txt", "ready_ns")
    tr = tr == "" ? duration : (tr - t0) / 1e9; if (tr > duration) tr = duration
    printf "<text x=\"%d\" y=\"%d\" font-weight=\"bold\">%s, --on-store-error %s</text>\n", px, oy + 10, esc(algorithm[r]), policy[r]
    printf "<text x=\"%d\" y=\"%d\" text-anchor=\"end\">over-grant %d</text>\n", px + pw, oy + 10, over[r]
    printf "<rect x=\"%.1f\" y=\"%d\" width=\"%.1f\" height=\"%d\" fill=\"#f4c7c3\"/>\n", x(tk), py, x(tp) - x(tk), ph + 8 + lh
    printf "<rect x=\"%.1f\" y=\"%d\" width=\"%.1f\" height=\"%d\" fill=\"#fce8e6\"/>\n", x(tp), py, x(tr) - x(tp), ph + 8 + lh
    printf "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"none\" stroke=\"#999\"/>\n", px, py, pw, ph
    printf "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"none\" stroke=\"#999\"/>\n", px, ly0, pw, lh
    printf "<text x=\"%d\" y=\"%d\" text-anchor=\"end\">%d/s</text><text x=\"%d\" y=\"%d\" text-anchor=\"end\">0</text>\n", px - 2, py + 8, rate, px - 2, py + ph
    for (g = 1; g <= 4; g++) {
      v = 10 ^ (g + 2); yy = ly(v)
      printf "<line x1=\"%d\" x2=\"%d\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>\n", px, px + pw, yy, yy
      printf "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\" font-size=\"8\">%s</text>\n", px - 2, yy + 3, g == 4 ? "1 s" : 10 ^ (g - 1) " ms"
    }
    for (s = 0; s <= duration; s += (duration > 12 ? 5 : 1))
      printf "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\" fill=\"#666\">%ds</text>\n", x(s), ly0 + lh + 11, s
    printf "<line x1=\"%d\" x2=\"%d\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"#333\" stroke-dasharray=\"4 3\"/>\n", px, px + pw, y(limit), y(limit)
    # Rates from the samples, each over the last 0.5 s.
    n = 0; file = dir "/metrics.tsv"
    while ((getline line < file) > 0) { split(line, f, " "); n++; st[n] = (f[1] - t0) / 1e9; sf[n] = f[2]; sa[n] = f[7] }
    close(file)
    admitted = ""; fallen = ""; j = 1
    for (i = 2; i <= n; i++) {
      while (j < i - 1 && st[i] - st[j + 1] >= 1) j++
      dt = st[i] - st[j]; if (dt < 0.9 || st[i] < 0 || st[i] > duration) continue
      admitted = admitted sprintf("%.1f,%.1f ", x(st[i]), y((sa[i] - sa[j]) / dt))
      fallen = fallen sprintf("%.1f,%.1f ", x(st[i]), y((sf[i] - sf[j]) / dt))
    }
    printf "<polyline fill=\"none\" stroke=\"#e8710a\" stroke-width=\"1.2\" points=\"%s\"/>\n", fallen
    printf "<polyline fill=\"none\" stroke=\"#188038\" stroke-width=\"1.5\" points=\"%s\"/>\n", admitted
    # p99 per second: the worst of the three groups.
    delete p99; last = 0
    for (g = 0; g < 3; g++) {
      file = dir "/node" g ".csv"
      while ((getline line < file) > 0) { split(line, f, ","); if (f[1] ~ /^[0-9]+$/) { if (f[8] + 0 > p99[f[1]]) p99[f[1]] = f[8] + 0; if (f[1] > last) last = f[1] } }
      close(file)
    }
    pts = ""
    for (s = 1; s <= last && s <= duration; s++) if (s in p99) pts = pts sprintf("%.1f,%.1f ", x(s - 0.5), ly(p99[s]))
    printf "<polyline fill=\"none\" stroke=\"#1a73e8\" stroke-width=\"1.2\" points=\"%s\"/>\n", pts
  }
  print "</svg>"
}
