# results.tsv (with its header line) -> the table printed in the terminal: a header, a rule, one
# line per run. Run with -F'\t'.
function ms(us) { return sprintf(us >= 100000 ? "%.0f" : us >= 10000 ? "%.1f" : "%.2f", us / 1000) }
function s(v) { return v == "never" ? v : sprintf("%.1f", v / 1000) }
function row(a, b, c, d, e, f, g, h, i, j, k, l) {
  printf "%-6s %-14s %6s %8s %6s %15s %22s %13s %7s %7s %14s %21s\n", a, b, c, d, e, f, g, h, i, l, j, k
}
function pct(a, b) { return b > 0 ? sprintf("%.0f%%", 100 * a / b) : "-" }
NR == 1 {
  row("policy", "algorithm", "sent", "answered", "errors", "fallbacks", "p99 ms", "admitted", "killed", "over-grant", "recovery s", "others")
  row("", "", "", "", "", "(breaker)", "before/during/after", "/ bound", "keys", "killed/others", "redis/fallbacks/rate", "keys")
  next
}
{
  row($1, $2, $3, $4, $5, $6 " (" $7 ")", ms($8) " / " ms($9) " / " ms($10), $11 " / " $12,
      pct($18, $19), $13 " / " $14, s($15) " / " s($16) " / " s($17), pct($21, $20))
}
