# args: [1, 2, 5]
import cmath

a, b, c = args
d = cmath.sqrt(b * b - 4 * a * c)
r1 = (-b + d) / (2 * a)
r2 = (-b - d) / (2 * a)
return [[r1.real, r1.imag], [r2.real, r2.imag]]
